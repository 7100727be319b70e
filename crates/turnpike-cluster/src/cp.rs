//! The control plane's side of `/v1/outlet` (Kong's `kong/clustering/control_plane.lua`): the
//! mutual-TLS WebSocket listener, each data plane's `basic_info` and version checks, the config
//! pushed on connect and on every change, the pings answered and recorded, and the data
//! planes' records (`GET /clustering/data-planes`, `/clustering/status`).

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use turnpike_config::conf::{ClusterConf, ClusterMtls};

use crate::compat::{self, SyncStatus};
use crate::hash::EMPTY_HASH;
use crate::payload::{self, Reconfigure};
use crate::{now_secs, tls, PING_WAIT, TIMEOUT};

/// Where the control plane's config comes from: the store.
pub trait ConfigSource: Send + Sync + 'static {
    /// The whole config as the store exports it (`_format_version` and a list per table).
    fn export(&self) -> Pin<Box<dyn Future<Output = Result<Value, String>> + Send + '_>>;
    /// The config version the node runs; it moves when the config changes.
    fn version(&self) -> i64;
    /// Told when [`ConfigSource::version`] moves (`None`: the version is polled).
    fn watch(&self) -> Option<watch::Receiver<i64>> {
        None
    }
}

/// A data plane as the control plane records it (Kong's `clustering_data_planes`).
#[derive(Debug, Clone)]
pub struct DataPlaneRecord {
    pub id: String,
    pub ip: String,
    pub hostname: Option<String>,
    pub version: String,
    pub sync_status: SyncStatus,
    pub config_hash: String,
    pub last_seen: i64,
    pub updated_at: i64,
    pub labels: Option<serde_json::Map<String, Value>>,
    pub cert_expiry: Option<i64>,
}

impl DataPlaneRecord {
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "ip": self.ip,
            "hostname": self.hostname,
            "version": self.version,
            "sync_status": self.sync_status.name(),
            "config_hash": self.config_hash,
            "last_seen": self.last_seen,
            "updated_at": self.updated_at,
            "labels": self.labels,
            "cert_details": self.cert_expiry.map(|e| json!({"expiry_timestamp": e})),
            "rpc_capabilities": [],
        })
    }
}

/// The control plane: what it sends and whom it has seen.
pub struct ControlPlane {
    conf: ClusterConf,
    /// This node's plugins and their versions, as data planes are checked against.
    plugins: Vec<(String, String)>,
    /// Kong's version this node speaks.
    version: String,
    current: watch::Sender<Option<Arc<Reconfigure>>>,
    records: Mutex<BTreeMap<String, DataPlaneRecord>>,
    /// Data planes connected now.
    connected: std::sync::atomic::AtomicUsize,
    /// The config version the config now sent was exported at (-1 before the first).
    exported_version: std::sync::atomic::AtomicI64,
}

/// Counts a connection for as long as it lives.
struct Connected<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Connected<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl ControlPlane {
    pub fn new(
        conf: ClusterConf,
        plugins: Vec<(String, String)>,
        version: &str,
    ) -> Arc<ControlPlane> {
        Arc::new(ControlPlane {
            conf,
            plugins,
            version: version.to_string(),
            current: watch::channel(None).0,
            records: Mutex::new(BTreeMap::new()),
            connected: Default::default(),
            exported_version: std::sync::atomic::AtomicI64::new(-1),
        })
    }

    /// What `/status` shows of the control plane: the config it sends (its hash, and the
    /// version of the store it was exported at) and how many data planes are connected.
    pub fn status_json(&self) -> Value {
        json!({
            "config_hash": self.config_hash(),
            "exported_version": self.exported_version.load(std::sync::atomic::Ordering::Relaxed),
            "data_planes_connected": self.connected(),
        })
    }

    /// How many data planes are connected now.
    pub fn connected(&self) -> usize {
        self.connected.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The data planes seen within `cluster_data_plane_purge_delay`, by id.
    pub fn data_planes(&self) -> Vec<DataPlaneRecord> {
        let now = now_secs();
        let ttl = self.conf.data_plane_purge_delay.as_secs() as i64;
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        records.retain(|_, r| r.updated_at + ttl > now);
        records.values().cloned().collect()
    }

    /// The hash of the config now sent to data planes (`None` before the first export).
    pub fn config_hash(&self) -> Option<String> {
        self.current
            .borrow()
            .as_ref()
            .map(|r| r.hashes.config.clone())
    }

    fn record(&self, r: &DataPlaneRecord) {
        // Kong's `id` is a UUID: a row with another id is refused (and only logged).
        if uuid_like(&r.id) {
            let mut rec = r.clone();
            rec.updated_at = now_secs();
            self.records
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(r.id.clone(), rec);
        } else {
            tracing::error!(
                "[clustering] unable to update clustering data plane status: id '{}' is not a UUID",
                r.id
            );
        }
    }

    /// Serves data planes on the cluster listeners and keeps the config they get current,
    /// until `shutdown`.
    pub async fn run(
        self: Arc<Self>,
        source: Arc<dyn ConfigSource>,
        listeners: Vec<std::net::TcpListener>,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), String> {
        let server = tls::server_config(&self.conf)?;
        let own_digest = tls::Identity::from_conf(&self.conf)?.digest();
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        tokio::spawn(self.clone().export_loop(source, shutdown.clone()));
        let mut accepting = tokio::task::JoinSet::new();
        for l in listeners {
            l.set_nonblocking(true).map_err(|e| e.to_string())?;
            let l = tokio::net::TcpListener::from_std(l).map_err(|e| e.to_string())?;
            let (cp, acceptor, mut shutdown) = (self.clone(), acceptor.clone(), shutdown.clone());
            accepting.spawn(async move {
                loop {
                    tokio::select! {
                        _ = shutdown.changed() => return,
                        a = l.accept() => match a {
                            Ok((tcp, peer)) => {
                                let _ = tcp.set_nodelay(true);
                                tokio::spawn(cp.clone().serve(tcp, peer, acceptor.clone(), own_digest, shutdown.clone()));
                            }
                            Err(e) => {
                                tracing::warn!("[clustering] accept: {e}");
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        }
                    }
                }
            });
        }
        accepting.join_all().await;
        Ok(())
    }

    /// Exports the config whenever its version moves (changes within 20 ms make one push),
    /// and hands it to every connection.
    async fn export_loop(
        self: Arc<Self>,
        source: Arc<dyn ConfigSource>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut sent: Option<i64> = None;
        let mut moved = source.watch();
        loop {
            let version = source.version();
            if sent != Some(version) {
                tracing::debug!("[clustering] config version {version} (sent: {sent:?})");
                // Writes close together (a decK sync) go out as one push.
                tokio::time::sleep(Duration::from_millis(20)).await;
                let version = source.version();
                let started = std::time::Instant::now();
                match self.export(source.as_ref()).await {
                    Ok(r) => {
                        tracing::info!(
                            "[clustering] config {} exported ({} bytes, {} compressed) in {:?}",
                            r.hashes.config,
                            r.inflated_len,
                            r.deflated.len(),
                            started.elapsed()
                        );
                        // The same config again (a write that changed nothing a data plane
                        // gets, as a credential's cache entry): nobody is woken.
                        let same = self
                            .current
                            .borrow()
                            .as_ref()
                            .is_some_and(|c| c.hashes.config == r.hashes.config);
                        if !same {
                            self.current.send_replace(Some(Arc::new(r)));
                        }
                        self.exported_version
                            .store(version, std::sync::atomic::Ordering::Relaxed);
                        sent = Some(version);
                    }
                    Err(e) => {
                        tracing::error!("[clustering] unable to export config from database: {e}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
            // Woken when the version moves; polled every second as well (and every 100 ms
            // for a source that cannot tell).
            let poll = Duration::from_millis(if moved.is_some() { 1000 } else { 100 });
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = async {
                    match moved.as_mut() {
                        Some(rx) => {
                            if rx.changed().await.is_err() {
                                std::future::pending::<()>().await;
                            }
                        }
                        None => std::future::pending::<()>().await,
                    }
                } => {}
                _ = tokio::time::sleep(poll) => {}
            }
        }
    }

    async fn export(&self, source: &dyn ConfigSource) -> Result<Reconfigure, String> {
        let value = source.export().await?;
        let previous = self.current.borrow().clone();
        tokio::task::spawn_blocking(move || {
            let (config, configured) = payload::export_config(value);
            Reconfigure::build_after(config, configured, previous.as_deref())
        })
        .await
        .map_err(|e| e.to_string())?
    }

    // The handshake callback's error type is tungstenite's (an HTTP response).
    #[allow(clippy::result_large_err)]
    async fn serve(
        self: Arc<Self>,
        tcp: tokio::net::TcpStream,
        peer: SocketAddr,
        acceptor: tokio_rustls::TlsAcceptor,
        own_digest: [u8; 32],
        shutdown: watch::Receiver<bool>,
    ) {
        let tls = match tokio::time::timeout(TIMEOUT, acceptor.accept(tcp)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                return tracing::warn!("[clustering] TLS handshake with {peer} failed: {e}")
            }
            Err(_) => return tracing::warn!("[clustering] TLS handshake with {peer} timed out"),
        };
        let cert = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.clone().into_owned());
        // Shared mode: the data plane must hold this node's own certificate (Kong answers 444:
        // the connection closed, nothing said).
        if self.conf.mtls == ClusterMtls::Shared
            && cert.as_ref().map(tls::digest) != Some(own_digest)
        {
            let why = if cert.is_some() {
                "data plane presented client certificate which does not match the shared data plane certificate"
            } else {
                "data plane presented no client certificate during handshake"
            };
            return tracing::error!("[clustering] {why} [ip: {}]", peer.ip());
        }
        let mut query: Option<BTreeMap<String, String>> = None;
        let callback = |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
            if req.uri().path() != "/v1/outlet" {
                return Err(refusal(404, "Not Found"));
            }
            let q = parse_query(req.uri().query().unwrap_or(""));
            let suffix = log_suffix(&q, peer);
            if !q.contains_key("node_id") {
                tracing::warn!("[clustering] data plane didn't pass the id{suffix}");
                return Err(refusal(400, "Bad Request"));
            }
            if !q.contains_key("node_version") {
                tracing::warn!("[clustering] data plane didn't pass the version{suffix}");
                return Err(refusal(400, "Bad Request"));
            }
            query = Some(q);
            Ok(resp)
        };
        let mut ws_conf = WebSocketConfig::default();
        ws_conf.max_message_size = Some(self.conf.max_payload);
        ws_conf.max_frame_size = Some(self.conf.max_payload);
        let accepted = tokio::time::timeout(
            TIMEOUT,
            tokio_tungstenite::accept_hdr_async_with_config(tls, callback, Some(ws_conf)),
        )
        .await;
        let mut ws = match accepted {
            Ok(Ok(ws)) => ws,
            Ok(Err(e)) => return tracing::debug!("[clustering] handshake with {peer}: {e}"),
            Err(_) => return tracing::warn!("[clustering] handshake with {peer} timed out"),
        };
        let q = query.unwrap_or_default();
        let suffix = log_suffix(&q, peer);
        let mut rec = DataPlaneRecord {
            id: q.get("node_id").cloned().unwrap_or_default(),
            ip: peer.ip().to_string(),
            hostname: q.get("node_hostname").cloned(),
            version: q.get("node_version").cloned().unwrap_or_default(),
            sync_status: SyncStatus::Unknown,
            config_hash: EMPTY_HASH.into(),
            last_seen: now_secs(),
            updated_at: now_secs(),
            labels: None,
            cert_expiry: cert.as_ref().and_then(tls::expiry),
        };

        // basic_info: the first frame, binary JSON.
        let first = tokio::time::timeout(TIMEOUT, ws.next()).await;
        let info = match first {
            Ok(Some(Ok(Message::Binary(data)))) => payload::read_basic_info(&data),
            Ok(Some(Ok(m))) => Err(format!("invalid basic info frame type: {}", frame_type(&m))),
            Ok(Some(Err(e))) => Err(format!("failed to receive websocket basic info frame: {e}")),
            Ok(None) => Err("failed to receive websocket basic info frame: closed".into()),
            Err(_) => Err("failed to receive websocket basic info frame: timeout".into()),
        };
        let info = match info {
            Ok(i) => i,
            Err(e) => {
                tracing::error!("[clustering] {e}{suffix}");
                let _ = ws.close(None).await;
                return;
            }
        };
        rec.labels = info.labels.clone();
        let dp_plugins = compat::plugins_map(&info.plugins);
        match compat::check_kong_version(&self.version, &rec.version) {
            Ok(note) => {
                if let Some(n) = note {
                    tracing::info!("[clustering] {n}{suffix}");
                }
            }
            Err(e) => {
                tracing::error!("[clustering] {e}{suffix}");
                rec.sync_status = SyncStatus::KongVersionIncompatible;
                self.record(&rec);
                let _ = ws.close(None).await;
                return;
            }
        }
        for (name, version) in &self.plugins {
            match dp_plugins.get(name) {
                None => tracing::warn!(
                    "[clustering] {name} plugin {version} is missing from data plane{suffix}"
                ),
                Some(p) => {
                    if let (Some(dpv), Some((dmaj, dmin)), Some((cmaj, cmin))) =
                        (&p.version, p.major_minor, compat::major_minor(version))
                    {
                        if dmaj != cmaj || dmin != cmin {
                            tracing::info!("[clustering] data plane {name} plugin version {dpv} is different to control plane plugin version {version}{suffix}");
                        }
                    }
                }
            }
        }
        tracing::info!("[clustering] data plane connected{suffix}");
        self.record(&rec);
        self.connected
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _connected = Connected(&self.connected);

        let mut configs = self.current.subscribe();
        configs.mark_changed();
        let mut shutdown = shutdown;
        let mut last_ping = tokio::time::Instant::now();
        // The hash of the last config sent on this connection.
        let mut last_sent: Option<String> = None;
        let end: Result<(), String> = loop {
            let deadline = last_ping + PING_WAIT;
            tokio::select! {
                _ = shutdown.changed() => break Ok(()),
                changed = configs.changed() => {
                    if changed.is_err() {
                        break Ok(());
                    }
                    let Some(r) = configs.borrow_and_update().clone() else { continue };
                    if last_sent.as_deref() == Some(r.hashes.config.as_str()) {
                        continue;
                    }
                    let before = rec.sync_status;
                    match compat::check_configuration(&self.plugins, &r.configured, &dp_plugins) {
                        Err((why, status)) => {
                            tracing::warn!("[clustering] unable to send updated configuration to data plane: {why}{suffix}");
                            rec.sync_status = status;
                        }
                        Ok(()) => {
                            rec.sync_status = SyncStatus::Normal;
                            // A Turnpike data plane holding the config the delta starts from
                            // gets only what changed; any other gets the whole config.
                            let delta = r.delta.as_ref().filter(|d| {
                                info.reads_deltas && last_sent.as_deref() == Some(d.base.as_str())
                            });
                            let (bytes, what) = match delta {
                                Some(d) => (d.deflated.clone(), "delta"),
                                None => (r.deflated.clone(), "config"),
                            };
                            if let Err(e) = ws.send(Message::Binary(bytes)).await {
                                break Err(format!("unable to send updated configuration to data plane: {e}"));
                            }
                            last_sent = Some(r.hashes.config.clone());
                            tracing::debug!("[clustering] sent {what} update to data plane{suffix}");
                        }
                    }
                    if rec.sync_status != before {
                        self.record(&rec);
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    break Err(format!("did not receive ping frame from data plane within {} seconds", PING_WAIT.as_secs()));
                }
                frame = ws.next() => {
                    let m = match frame {
                        None => break Ok(()),
                        Some(Err(e)) => break Err(format!("error while receiving frame from data plane: {e}")),
                        Some(Ok(m)) => m,
                    };
                    let data = match &m {
                        Message::Close(_) => {
                            tracing::debug!("[clustering] received close frame from data plane{suffix}");
                            break Ok(());
                        }
                        Message::Ping(d) | Message::Pong(d) | Message::Binary(d) => d.to_vec(),
                        Message::Text(t) => t.as_bytes().to_vec(),
                        Message::Frame(_) => Vec::new(),
                    };
                    if data.len() != 32 {
                        break Err(format!(
                            "received a ping frame from the data plane with an invalid hash: '{}'",
                            String::from_utf8_lossy(&data)
                        ));
                    }
                    if !matches!(m, Message::Ping(_)) {
                        break Err(format!("invalid websocket frame received from data plane: {}", frame_type(&m)));
                    }
                    // The pong is queued by the WebSocket layer and goes out with the next
                    // read or write.
                    last_ping = tokio::time::Instant::now();
                    rec.config_hash = String::from_utf8_lossy(&data).into_owned();
                    rec.last_seen = now_secs();
                    self.record(&rec);
                    if let Err(e) = ws.flush().await {
                        break Err(format!("failed to send pong frame to data plane: {e}"));
                    }
                }
            }
        };
        let _ = ws.close(None).await;
        match end {
            Ok(()) => tracing::info!("[clustering] data plane disconnected{suffix}"),
            Err(e) => tracing::error!("[clustering] {e}{suffix}"),
        }
    }
}

fn frame_type(m: &Message) -> &'static str {
    match m {
        Message::Text(_) => "text",
        Message::Binary(_) => "binary",
        Message::Ping(_) => "ping",
        Message::Pong(_) => "pong",
        Message::Close(_) => "close",
        Message::Frame(_) => "frame",
    }
}

fn refusal(status: u16, text: &str) -> ErrorResponse {
    let mut r = ErrorResponse::new(Some(text.to_string()));
    *r.status_mut() = tokio_tungstenite::tungstenite::http::StatusCode::from_u16(status)
        .unwrap_or(tokio_tungstenite::tungstenite::http::StatusCode::BAD_REQUEST);
    r
}

/// The query's parameters as they came: Kong reads them undecoded (`ngx.var.arg_*`), and its
/// data planes write them unencoded.
fn parse_query(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter_map(|p| p.split_once('='))
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn log_suffix(q: &BTreeMap<String, String>, peer: SocketAddr) -> String {
    let mut parts = Vec::new();
    if let Some(id) = q.get("node_id") {
        parts.push(format!("id: {id}"));
    }
    if let Some(h) = q.get("node_hostname") {
        parts.push(format!("host: {h}"));
    }
    parts.push(format!("ip: {}", peer.ip()));
    if let Some(v) = q.get("node_version") {
        parts.push(format!("version: {v}"));
    }
    format!(" [{}]", parts.join(", "))
}

fn uuid_like(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_as_data_planes_send_them() {
        let q = parse_query("node_id=1f0e&node_hostname=dp-1&node_version=3.9.1&x=");
        assert_eq!(q["node_id"], "1f0e");
        assert_eq!(q["node_hostname"], "dp-1");
        assert!(!q.contains_key("x"));
        assert_eq!(parse_query("a=%41%2f")["a"], "%41%2f");
        assert!(uuid_like("00000000-0000-4000-8000-000000000001"));
        assert!(!uuid_like("dp-1"));
    }
}
