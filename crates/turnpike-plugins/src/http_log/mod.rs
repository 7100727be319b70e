//! http-log (PRIORITY 12): each request's log entry, as Kong serializes it, sent to an HTTP
//! endpoint through Kong's queue semantics. The request path only offers the entry to a
//! bounded queue (`queue.max_entries`) and never waits: when the queue is full the entry is
//! dropped and counted (`turnpike_log_entries_dropped_total{plugin="http-log"}`). A sender
//! thread per queue batches entries (`max_batch_size`, `max_coalescing_delay`), sends them on a
//! kept-alive connection and retries a failed batch with exponential back-off
//! (`initial_retry_delay` doubling up to `max_retry_delay`) for up to `max_retry_time`, after
//! which the batch is dropped and counted.

pub(crate) mod schema;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderName, HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::log::LogEntry;
use crate::{Handler, PluginSpec};

pub struct HttpLog;

/// http-log's part of the node's [`crate::Runtime`]: one queue per distinct sending config,
/// shared by the plugin instances that have it and kept across reloads (queued entries survive
/// a config change), and what was sent and dropped over all of them.
#[derive(Default)]
pub struct State {
    queues: Mutex<HashMap<String, Arc<Queue>>>,
    pub tally: Arc<Tally>,
}

/// Entries sent, and dropped (queue full, or a batch that could not be delivered in time).
#[derive(Default)]
pub struct Tally {
    pub sent: AtomicU64,
    pub dropped: AtomicU64,
}

/// Where and how a queue sends (http-log's, and opentelemetry's with its own body).
#[derive(Clone)]
pub(crate) struct Target {
    pub uri: Uri,
    pub method: Method,
    pub content_type: HeaderValue,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub timeout: Duration,
    pub batch: usize,
    pub coalescing: Duration,
    pub max_retry_time: Duration,
    pub initial_retry_delay: Duration,
    pub max_retry_delay: Duration,
    /// The request body for a batch of entries.
    pub assemble: Assemble,
    /// Who sends, in the sender's log lines.
    pub plugin: &'static str,
}

/// Makes one request body of a batch of queued entries.
pub(crate) type Assemble = Arc<dyn Fn(&[Bytes]) -> Bytes + Send + Sync>;

/// A sending config's bounded queue: entries are offered, never waited for.
pub(crate) struct Queue {
    tx: mpsc::Sender<Bytes>,
    tally: Arc<Tally>,
    plugin: &'static str,
}

impl Queue {
    /// Queues an entry; when the queue is full it is dropped and counted.
    pub(crate) fn offer(&self, entry: Bytes) {
        if self.tx.try_send(entry).is_err() {
            let n = self.tally.dropped.fetch_add(1, Ordering::Relaxed);
            if n.is_multiple_of(1000) {
                tracing::warn!(
                    "{}: queue full; entries dropped ({} so far)",
                    self.plugin,
                    n + 1
                );
            }
        }
    }
}

pub(crate) fn seconds(v: f64) -> Duration {
    Duration::from_secs_f64(v.clamp(0.0, 1e6))
}

/// http-log's bodies: one entry as itself, several as a JSON array (Kong's shapes).
fn json_batch(batch: &[Bytes]) -> Bytes {
    if batch.len() == 1 {
        return batch[0].clone();
    }
    let mut out = Vec::with_capacity(batch.iter().map(|b| b.len() + 1).sum::<usize>() + 2);
    out.push(b'[');
    for (i, e) in batch.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(e);
    }
    out.push(b']');
    Bytes::from(out)
}

fn target(c: &schema::Config) -> Result<(Target, usize), String> {
    let uri: Uri = c
        .http_endpoint
        .parse()
        .map_err(|e| format!("http_endpoint: {e}"))?;
    let mut headers = Vec::new();
    // Credentials in the URL become Basic authentication (Kong's rule).
    if let Some(authority) = uri.authority() {
        if let Some((userinfo, _)) = authority.as_str().rsplit_once('@') {
            use base64::Engine;
            let token = base64::engine::general_purpose::STANDARD.encode(userinfo);
            if let Ok(v) = HeaderValue::from_str(&format!("Basic {token}")) {
                headers.push((header::AUTHORIZATION, v));
            }
        }
    }
    for (k, v) in c.headers.iter().flatten() {
        let name = HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| format!("headers: invalid header name '{k}'"))?;
        let value =
            HeaderValue::from_str(v).map_err(|_| format!("headers: invalid value for '{k}'"))?;
        headers.push((name, value));
    }
    let q = &c.queue;
    let max_entries = q.max_entries.or(c.queue_size).unwrap_or(10000) as usize;
    Ok((
        Target {
            method: c.method.parse().unwrap_or(Method::POST),
            content_type: HeaderValue::from_str(&c.content_type)
                .unwrap_or(HeaderValue::from_static("application/json")),
            headers,
            timeout: Duration::from_millis(c.timeout as u64),
            batch: q.max_batch_size.max(1) as usize,
            coalescing: seconds(q.max_coalescing_delay),
            max_retry_time: seconds(q.max_retry_time),
            initial_retry_delay: seconds(q.initial_retry_delay),
            max_retry_delay: seconds(q.max_retry_delay),
            uri,
            assemble: Arc::new(json_batch),
            plugin: "http-log",
        },
        max_entries,
    ))
}

/// The queue of a sending config (see [`State`]).
fn queue(
    state: &State,
    spawner: &crate::spawner::Spawner,
    config: &Value,
    c: &schema::Config,
) -> Result<Arc<Queue>, String> {
    start_queue(state, spawner, config.to_string(), || target(c))
}

/// The queue for `key` in `state` (one per distinct sending config, kept across reloads),
/// its sender thread started with the target `make` gives the first time.
pub(crate) fn start_queue(
    state: &State,
    spawner: &crate::spawner::Spawner,
    key: String,
    make: impl FnOnce() -> Result<(Target, usize), String>,
) -> Result<Arc<Queue>, String> {
    let mut queues = state.queues.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(q) = queues.get(&key) {
        return Ok(q.clone());
    }
    let (target, max_entries) = make()?;
    let plugin = target.plugin;
    let (tx, rx) = mpsc::channel(max_entries);
    let tally = state.tally.clone();
    let sent = tally.clone();
    spawner
        .spawn(
            plugin,
            move || match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(send_loop(target, rx, sent)),
                Err(e) => tracing::error!("{plugin}: cannot start its sender: {e}"),
            },
        )
        .map_err(|e| format!("cannot start the {plugin} sender: {e}"))?;
    let q = Arc::new(Queue { tx, tally, plugin });
    queues.insert(key, q.clone());
    Ok(q)
}

/// A kept-alive connection to the endpoint.
type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(t: &Target) -> Result<Sender, String> {
    let https = t.uri.scheme_str() == Some("https");
    let host = t.uri.host().unwrap_or("localhost").to_string();
    let port = t.uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tcp = tokio::net::TcpStream::connect((host.trim_matches(['[', ']']), port))
        .await
        .map_err(|e| e.to_string())?;
    let _ = tcp.set_nodelay(true);
    macro_rules! handshake {
        ($io:expr) => {{
            let (sender, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new($io))
                    .await
                    .map_err(|e| e.to_string())?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok(sender)
        }};
    }
    if https {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name =
            rustls::pki_types::ServerName::try_from(host.trim_matches(['[', ']']).to_string())
                .map_err(|e| e.to_string())?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        handshake!(tls)
    } else {
        handshake!(tcp)
    }
}

/// Sends one batch once; `Err` says why it did not get a 2xx.
async fn send(t: &Target, conn: &mut Option<Sender>, body: Bytes) -> Result<(), String> {
    if conn.as_ref().is_none_or(|c| c.is_closed()) {
        *conn = Some(
            tokio::time::timeout(t.timeout, connect(t))
                .await
                .map_err(|_| "connect timeout".to_string())??,
        );
    }
    let sender = conn.as_mut().expect("connected above");
    let path = t.uri.path_and_query().map_or("/", |p| p.as_str());
    let host = t.uri.authority().map_or("", |a| {
        a.as_str().rsplit_once('@').map_or(a.as_str(), |(_, h)| h)
    });
    let mut req = Request::builder()
        .method(t.method.clone())
        .uri(path)
        .header(header::HOST, host)
        .header(header::CONTENT_TYPE, t.content_type.clone())
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    for (k, v) in &t.headers {
        req.headers_mut().insert(k.clone(), v.clone());
    }
    let sent = tokio::time::timeout(t.timeout, async {
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let _ = resp.into_body().collect().await;
        Ok::<_, String>(status)
    })
    .await;
    match sent {
        Ok(Ok(s)) if s.is_success() => Ok(()),
        Ok(Ok(s)) => Err(format!("status {s}")),
        Ok(Err(e)) => {
            *conn = None;
            Err(e)
        }
        Err(_) => {
            *conn = None;
            Err("timeout".into())
        }
    }
}

/// The sender: batches, sends, retries with back-off, drops what could not go in time.
async fn send_loop(t: Target, mut rx: mpsc::Receiver<Bytes>, tally: Arc<Tally>) {
    let mut conn: Option<Sender> = None;
    let mut failing = false;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        // One timer for the batch (not one per entry): entries already queued are taken
        // without waiting, then the next one or the coalescing delay, whichever comes first.
        let deadline = tokio::time::sleep_until((Instant::now() + t.coalescing).into());
        tokio::pin!(deadline);
        while batch.len() < t.batch {
            if let Ok(e) = rx.try_recv() {
                batch.push(e);
                continue;
            }
            tokio::select! {
                biased;
                e = rx.recv() => match e {
                    Some(e) => batch.push(e),
                    None => break,
                },
                () = &mut deadline => break,
            }
        }
        let body = (t.assemble)(&batch);
        let started = Instant::now();
        let mut delay = t.initial_retry_delay;
        loop {
            match send(&t, &mut conn, body.clone()).await {
                Ok(()) => {
                    tally.sent.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    if failing {
                        tracing::warn!("{}: {} reachable again", t.plugin, t.uri);
                        failing = false;
                    }
                    break;
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!("{}: cannot send to {}: {e}; retrying", t.plugin, t.uri);
                        failing = true;
                    }
                    if started.elapsed() + delay > t.max_retry_time {
                        tally
                            .dropped
                            .fetch_add(batch.len() as u64, Ordering::Relaxed);
                        tracing::error!(
                            "{}: {} entries dropped after {:?} of retries to {}",
                            t.plugin,
                            batch.len(),
                            t.max_retry_time,
                            t.uri
                        );
                        break;
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(t.max_retry_delay);
                }
            }
        }
    }
}

struct Configured {
    queue: Arc<Queue>,
    /// `custom_fields_by_lua`, when set.
    fields: Option<crate::lua::LogFields>,
}

impl PluginSpec for HttpLog {
    fn name(&self) -> &'static str {
        "http-log"
    }
    fn priority(&self) -> i32 {
        12
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn entity_checks(&self, config: &Value) -> Vec<(String, String)> {
        let mut errs = Vec::new();
        match config["http_endpoint"].as_str().map(str::parse::<Uri>) {
            Some(Ok(u))
                if matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some() => {}
            _ => errs.push((
                "http_endpoint".into(),
                "missing host in url or unsupported scheme (http, https)".into(),
            )),
        }
        if config["queue"]["concurrency_limit"].as_i64() == Some(0) {
            errs.push((
                "queue.concurrency_limit".into(),
                "expected one of: -1, 1".into(),
            ));
        }
        if let Some(map) = config["headers"].as_object() {
            for k in map.keys() {
                if HeaderName::from_bytes(k.as_bytes()).is_err() {
                    errs.push(("headers".into(), format!("invalid header name '{k}'")));
                }
            }
        }
        errs
    }
    fn lua_checks(&self, config: &Value, lua: &Arc<crate::lua::Settings>) -> Vec<(String, String)> {
        crate::lua::check_log_fields("http-log", config, lua)
    }
    fn build(&self, config: &Value, ctx: &crate::BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: schema::Config = crate::typed(config)?;
        Ok(Arc::new(Configured {
            queue: queue(&ctx.runtime.http_log, &ctx.runtime.spawner, config, &c)?,
            fields: crate::lua::LogFields::new(
                "http-log",
                c.custom_fields_by_lua.as_ref(),
                ctx.runtime.lua.settings(),
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
        let line = crate::lua::log_text(entry, self.fields.as_ref());
        self.queue.offer(Bytes::from(line));
    }
}
