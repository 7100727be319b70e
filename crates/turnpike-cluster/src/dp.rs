//! The data plane's side of `/v1/outlet` (Kong's `kong/clustering/data_plane.lua`): connect
//! (directly or through an HTTP CONNECT proxy), send `basic_info`, apply every `reconfigure`
//! through the same loader and compiler a declarative file goes through, ping with the applied
//! config's hash every 30 s and right after applying, drop a control plane silent for 45 s and
//! reconnect after 5 to 10 s. The last config applied is kept under the prefix, so a data plane
//! started while its control plane is away serves it at once.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use turnpike_config::conf::ClusterConf;

use crate::hash::EMPTY_HASH;
use crate::payload::{self, Received};
use crate::{now_secs, tls, PING_INTERVAL, PING_WAIT, TIMEOUT};

/// How a data plane's config is applied: the same path as a declarative file's.
pub trait Applier: Send + Sync + 'static {
    /// Loads, compiles and installs the config (its JSON text), identified by `hash`. An `Err`
    /// leaves the running config as it was.
    fn apply(&self, config_text: &str, hash: &str) -> Result<(), String>;

    /// Applies changes (`table`, `id`, the entity or `None` when it is gone) to the running
    /// config, which becomes the one identified by `hash`; what they leave alone is not
    /// rebuilt. An `Err` leaves the running config as it was.
    fn apply_delta(&self, changes: Vec<Change>, hash: &str) -> Result<(), String>;
}

pub use crate::payload::Change;

/// A delta that does not start from the config this data plane runs: the connection is
/// started again at once, for the whole config.
const BEHIND: &str = "the delta starts from another config than the one running";

/// The deltas kept outgrew the whole config they follow: the connection is started again at
/// once, and the whole config the control plane sends first replaces them.
const COMPACT: &str = "the deltas kept outgrew the whole config: asking for it again";

/// Below this many bytes of kept deltas, none are compacted (a small config's deltas soon
/// outweigh it).
const COMPACT_FLOOR: u64 = 64 * 1024;

/// Whether an ended session is started again at once (no 5 to 10 s wait).
fn at_once(e: &str) -> bool {
    e.contains(BEHIND) || e.contains(COMPACT)
}

/// Who this data plane is, as it tells its control plane.
pub struct NodeInfo {
    pub node_id: String,
    pub hostname: String,
    /// Kong's version this node speaks.
    pub version: String,
    /// Its plugins and their versions.
    pub plugins: Vec<(String, String)>,
    /// Its configuration, without secrets (`basic_info.process_conf`).
    pub process_conf: Value,
}

#[derive(Default)]
struct Status {
    connected: bool,
    /// When the connection last changed (up or down), seconds since the epoch.
    since: i64,
    last_error: Option<String>,
    applied_hash: Option<String>,
    applied_at: Option<i64>,
}

pub struct DataPlane {
    conf: ClusterConf,
    node: NodeInfo,
    applier: Arc<dyn Applier>,
    /// Where the last whole config applied is kept, and the deltas applied since (each a
    /// 4-byte big-endian length and the message as it came).
    cache: PathBuf,
    deltas: PathBuf,
    status: Mutex<Status>,
    /// The deltas kept outgrew the whole config ([`COMPACT`]).
    compact: std::sync::atomic::AtomicBool,
}

/// The largest config a message may inflate to: Kong has no bound; a gzip bomb must not take
/// the node's memory. 16 times the largest message (256 MiB at Kong's default).
fn inflate_limit(conf: &ClusterConf) -> usize {
    conf.max_payload.saturating_mul(16)
}

impl DataPlane {
    pub fn new(
        conf: ClusterConf,
        node: NodeInfo,
        applier: Arc<dyn Applier>,
        prefix: &std::path::Path,
    ) -> Arc<DataPlane> {
        Arc::new(DataPlane {
            conf,
            node,
            applier,
            cache: prefix.join("cluster").join("config.json.gz"),
            deltas: prefix.join("cluster").join("deltas.bin"),
            status: Mutex::new(Status::default()),
            compact: Default::default(),
        })
    }

    fn status(&self) -> std::sync::MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The hash of the config applied (Kong's empty hash before any).
    pub fn applied_hash(&self) -> String {
        self.status()
            .applied_hash
            .clone()
            .unwrap_or_else(|| EMPTY_HASH.into())
    }

    /// The cluster certificate's notAfter (seconds since the epoch).
    pub fn cert_expiry(&self) -> Option<i64> {
        let certs = turnpike_config::declarative::pem::certificates(&self.conf.cert).ok()?;
        tls::expiry(certs.first()?)
    }

    /// What `/status` shows of the control plane connection.
    pub fn status_json(&self) -> Value {
        let s = self.status();
        json!({
            "control_plane": self.conf.control_plane,
            "connected": s.connected,
            "since": s.since,
            "last_error": s.last_error,
            "config_hash": s.applied_hash.clone().unwrap_or_else(|| EMPTY_HASH.into()),
            "config_applied_at": s.applied_at,
        })
    }

    /// Applies the config kept from the last run, if any (at start, before traffic), and the
    /// deltas applied after it.
    pub fn load_cache(&self) -> Result<bool, String> {
        let data = match std::fs::read(&self.cache) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(format!("cannot read {}: {e}", self.cache.display())),
        };
        self.apply_message(&data, false)
            .map_err(|e| format!("{}: {e}", self.cache.display()))?;
        let deltas = std::fs::read(&self.deltas).unwrap_or_default();
        let mut rest = deltas.as_slice();
        while rest.len() >= 4 {
            let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
            let Some(msg) = rest.get(4..4 + len) else {
                break;
            };
            if let Err(e) = self.apply_message(msg, false) {
                tracing::warn!("[clustering] a kept delta does not apply ({e}): the control plane will send the whole config");
                break;
            }
            rest = &rest[4 + len..];
        }
        Ok(true)
    }

    /// Reads, applies and (when `keep`) stores a `reconfigure` or `turnpike_delta` message:
    /// what was applied, for the log (`None`: the config was the one running).
    fn apply_message(&self, deflated: &[u8], keep: bool) -> Result<Option<String>, String> {
        let text = payload::gunzip(deflated, inflate_limit(&self.conf))?;
        let msg: Received =
            serde_json::from_slice(&text).map_err(|e| format!("cannot decode the message: {e}"))?;
        if msg.kind == payload::DELTA_TYPE {
            let delta: payload::ReceivedDelta = serde_json::from_slice(&text)
                .map_err(|e| format!("cannot decode the delta: {e}"))?;
            if self.status().applied_hash.as_deref() != Some(delta.base.as_str()) {
                return Err(BEHIND.into());
            }
            let hash = delta.config_hash.clone();
            let n = delta.changes.len();
            for (table, id, entity) in &delta.changes {
                tracing::debug!(
                    "[clustering] delta: {table} {id} {}",
                    if entity.is_some() { "set" } else { "removed" }
                );
            }
            self.applier.apply_delta(delta.changes, &hash)?;
            self.applied(&hash);
            if keep {
                match self.keep_delta(deflated) {
                    Ok(true) => self
                        .compact
                        .store(true, std::sync::atomic::Ordering::Relaxed),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!("[clustering] cannot keep the delta under the prefix: {e}")
                    }
                }
            }
            return Ok(Some(format!(
                "delta of {n} entities ({} bytes)",
                deflated.len()
            )));
        }
        if msg.kind != "reconfigure" {
            return Ok(None);
        }
        let hash = msg.hash()?;
        if self.status().applied_hash.as_deref() == Some(hash.as_str()) {
            tracing::debug!(
                "[clustering] same config received from control plane, no need to reload"
            );
            // The config running, whole: kept as it is, the deltas kept before it go.
            if keep && self.deltas.exists() {
                if let Err(e) = self.keep(deflated) {
                    tracing::warn!("[clustering] cannot keep the config under the prefix: {e}");
                }
            }
            return Ok(None);
        }
        let table = msg
            .config_table
            .ok_or("the message holds no config_table")?;
        self.applier.apply(table.get(), &hash)?;
        self.applied(&hash);
        if keep {
            if let Err(e) = self.keep(deflated) {
                tracing::warn!("[clustering] cannot keep the config under the prefix: {e}");
            }
        }
        Ok(Some(format!("whole config ({} bytes)", deflated.len())))
    }

    fn applied(&self, hash: &str) {
        let mut s = self.status();
        s.applied_hash = Some(hash.to_string());
        s.applied_at = Some(now_secs());
    }

    /// Writes the message whole, then renames it over the last one: a crash never leaves half
    /// a config to start from. The deltas kept after the last one go.
    fn keep(&self, deflated: &[u8]) -> std::io::Result<()> {
        let dir = self.cache.parent().expect("cache dir");
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join(format!(".config.json.gz.{}", std::process::id()));
        std::fs::write(&tmp, deflated)?;
        let _ = std::fs::remove_file(&self.deltas);
        std::fs::rename(&tmp, &self.cache)
    }

    /// Appends a delta to those kept after the whole config; a torn last record (a crash in
    /// the write) is ignored at start, and the control plane sends what is missing. `true`:
    /// the deltas kept now outweigh the whole config ([`COMPACT`]).
    fn keep_delta(&self, deflated: &[u8]) -> std::io::Result<bool> {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.deltas)?;
        let mut record = (deflated.len() as u32).to_be_bytes().to_vec();
        record.extend_from_slice(deflated);
        f.write_all(&record)?;
        let kept = f.metadata()?.len();
        let whole = std::fs::metadata(&self.cache).map_or(0, |m| m.len());
        Ok(kept > whole.max(COMPACT_FLOOR))
    }

    /// Stays connected to the control plane until `shutdown`.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        loop {
            let uri = self.uri();
            let result = tokio::select! {
                _ = shutdown.changed() => return,
                r = self.clone().session(&uri) => r,
            };
            // Behind the control plane's deltas: connect again at once for the whole config.
            let now = matches!(&result, Err(e) if at_once(e));
            let delay = if now { 0 } else { rand::random_range(5..=10) };
            {
                let mut s = self.status();
                s.connected = false;
                s.since = now_secs();
                if let Err(e) = &result {
                    s.last_error = Some(e.clone());
                }
            }
            match result {
                Ok(()) => tracing::info!(
                    "[clustering] control plane closed the connection (reconnecting after {delay} seconds) [{}]",
                    self.conf.control_plane
                ),
                Err(e) => tracing::warn!(
                    "[clustering] connection to control plane {uri} broken: {e} (retrying after {delay} seconds) [{}]",
                    self.conf.control_plane
                ),
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(Duration::from_secs(delay)) => {}
            }
        }
    }

    fn uri(&self) -> String {
        // Kong writes the values as they are, without encoding them.
        format!(
            "wss://{}/v1/outlet?node_id={}&node_hostname={}&node_version={}",
            self.conf.control_plane, self.node.node_id, self.node.hostname, self.node.version
        )
    }

    async fn session(self: Arc<Self>, uri: &str) -> Result<(), String> {
        let (tls_conf, name) = tls::client_config(&self.conf)?;
        let tcp = tokio::time::timeout(TIMEOUT, self.connect_tcp())
            .await
            .map_err(|_| "timeout".to_string())??;
        let _ = tcp.set_nodelay(true);
        let tls = tokio::time::timeout(
            TIMEOUT,
            tokio_rustls::TlsConnector::from(tls_conf).connect(name, tcp),
        )
        .await
        .map_err(|_| "TLS handshake timed out".to_string())?
        .map_err(|e| format!("TLS handshake failed: {e}"))?;
        let mut ws_conf = WebSocketConfig::default();
        ws_conf.max_message_size = Some(self.conf.max_payload);
        ws_conf.max_frame_size = Some(self.conf.max_payload);
        let (mut ws, _) = tokio::time::timeout(
            TIMEOUT,
            tokio_tungstenite::client_async_with_config(uri, tls, Some(ws_conf)),
        )
        .await
        .map_err(|_| "WebSocket handshake timed out".to_string())?
        .map_err(|e| format!("WebSocket handshake failed: {e}"))?;
        let info = payload::basic_info(
            &self.node.plugins,
            self.node.process_conf.clone(),
            &self.conf.dp_labels,
            &[payload::DELTA_TYPE],
        );
        ws.send(Message::Binary(info.into()))
            .await
            .map_err(|e| format!("unable to send basic information to control plane: {e}"))?;
        {
            let mut s = self.status();
            s.connected = true;
            s.since = now_secs();
            s.last_error = None;
        }
        tracing::info!(
            "[clustering] connected to control plane {}",
            self.conf.control_plane
        );
        let mut ping_at = tokio::time::Instant::now();
        let mut last_seen = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(ping_at) => {
                    let hash = self.applied_hash();
                    ws.send(Message::Ping(hash.into_bytes().into()))
                        .await
                        .map_err(|e| format!("unable to send ping frame to control plane: {e}"))?;
                    ping_at = tokio::time::Instant::now() + PING_INTERVAL;
                }
                _ = tokio::time::sleep_until(last_seen + PING_WAIT) => {
                    return Err(format!(
                        "did not receive pong frame from control plane within {} seconds",
                        PING_WAIT.as_secs()
                    ));
                }
                frame = ws.next() => {
                    let m = match frame {
                        None => return Ok(()),
                        Some(Err(e)) => return Err(format!("error while receiving frame from control plane: {e}")),
                        Some(Ok(m)) => m,
                    };
                    last_seen = tokio::time::Instant::now();
                    match m {
                        Message::Close(_) => {
                            tracing::debug!("[clustering] received close frame from control plane");
                            return Ok(());
                        }
                        Message::Binary(data) => {
                            let dp = self.clone();
                            let started = std::time::Instant::now();
                            let applied = tokio::task::spawn_blocking(move || dp.apply_message(&data, true))
                                .await
                                .map_err(|e| e.to_string())?;
                            match applied {
                                Ok(Some(what)) => {
                                    tracing::info!(
                                        "[clustering] config {} applied in {:?}: {what}",
                                        self.applied_hash(),
                                        started.elapsed()
                                    );
                                    // The control plane learns the new hash at once.
                                    ping_at = tokio::time::Instant::now();
                                    if self.compact.swap(false, std::sync::atomic::Ordering::Relaxed) {
                                        return Err(COMPACT.into());
                                    }
                                }
                                Ok(None) => {}
                                Err(e) if e == BEHIND => return Err(e),
                                Err(e) => {
                                    tracing::error!("[clustering] unable to update running config: {e}");
                                    self.status().last_error = Some(format!("unable to update running config: {e}"));
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    /// A TCP connection to the control plane, or through `proxy_server` (HTTP CONNECT) when
    /// `cluster_use_proxy` is on.
    async fn connect_tcp(&self) -> Result<tokio::net::TcpStream, String> {
        let target = &self.conf.control_plane;
        let Some(proxy) = self
            .conf
            .use_proxy
            .then_some(())
            .and(self.conf.proxy_server.as_ref())
        else {
            return tokio::net::TcpStream::connect(target.as_str())
                .await
                .map_err(|e| format!("cannot connect to {target}: {e}"));
        };
        let p = Proxy::parse(proxy)?;
        let mut tcp = tokio::net::TcpStream::connect(p.addr.as_str())
            .await
            .map_err(|e| format!("cannot connect to proxy {}: {e}", p.addr))?;
        let mut head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
        if let Some(auth) = &p.authorization {
            head.push_str(&format!("Proxy-Authorization: {auth}\r\n"));
        }
        head.push_str("\r\n");
        tcp.write_all(head.as_bytes())
            .await
            .map_err(|e| format!("proxy {}: {e}", p.addr))?;
        // The proxy's answer, read a byte at a time so nothing of the tunnel is taken.
        let mut answer = Vec::new();
        while !answer.ends_with(b"\r\n\r\n") {
            if answer.len() > 8192 {
                return Err(format!("proxy {}: answer head too large", p.addr));
            }
            let b = tcp
                .read_u8()
                .await
                .map_err(|e| format!("proxy {}: {e}", p.addr))?;
            answer.push(b);
        }
        let status_line = String::from_utf8_lossy(&answer);
        let status_line = status_line.lines().next().unwrap_or("");
        let code = status_line.split_whitespace().nth(1).unwrap_or("");
        if !code.starts_with('2') {
            return Err(format!(
                "proxy {} refused the tunnel: {status_line}",
                p.addr
            ));
        }
        Ok(tcp)
    }
}

/// `proxy_server` as the data plane uses it: `http://[user:password@]host[:port]`.
struct Proxy {
    addr: String,
    authorization: Option<String>,
}

impl Proxy {
    fn parse(url: &str) -> Result<Proxy, String> {
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            format!(
                "proxy_server {url}: only http:// proxies are supported for the cluster connection"
            )
        })?;
        let rest = rest.split('/').next().unwrap_or(rest);
        let (userinfo, hostport) = match rest.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, rest),
        };
        let addr = if hostport
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
            && !hostport.ends_with(']')
        {
            hostport.to_string()
        } else {
            format!("{hostport}:80")
        };
        let authorization = userinfo.map(|u| {
            use base64::Engine;
            let (user, pass) = u.split_once(':').unwrap_or((u, ""));
            let plain = format!("{}:{}", unescape(user), unescape(pass));
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(plain)
            )
        });
        Ok(Proxy {
            addr,
            authorization,
        })
    }
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(hex, 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_urls() {
        let p = Proxy::parse("http://user:p%40ss@proxy.local:3128").unwrap();
        assert_eq!(p.addr, "proxy.local:3128");
        assert_eq!(p.authorization.as_deref(), Some("Basic dXNlcjpwQHNz"));
        let p = Proxy::parse("http://proxy.local").unwrap();
        assert_eq!((p.addr.as_str(), p.authorization), ("proxy.local:80", None));
        assert!(Proxy::parse("https://proxy.local").is_err());
    }

    /// An applier that records what it was given.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    impl Applier for Recorder {
        fn apply(&self, _text: &str, hash: &str) -> Result<(), String> {
            self.0.lock().unwrap().push(format!("whole {hash}"));
            Ok(())
        }
        fn apply_delta(&self, changes: Vec<Change>, hash: &str) -> Result<(), String> {
            self.0
                .lock()
                .unwrap()
                .push(format!("delta {} {hash}", changes.len()));
            Ok(())
        }
    }

    fn conf() -> ClusterConf {
        ClusterConf {
            role: turnpike_config::conf::Role::DataPlane,
            listen: Vec::new(),
            control_plane: "127.0.0.1:1".into(),
            cert: String::new(),
            cert_key: String::new(),
            ca_cert: None,
            mtls: turnpike_config::conf::ClusterMtls::Shared,
            server_name: None,
            max_payload: 16 << 20,
            data_plane_purge_delay: Duration::from_secs(60),
            dp_labels: Vec::new(),
            use_proxy: false,
            proxy_server: None,
        }
    }

    #[test]
    fn kept_deltas_replay_at_start_and_are_compacted_when_they_outweigh_the_config() {
        use crate::payload::Reconfigure;
        let dir = std::env::temp_dir().join(format!("tp-dp-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let node = || NodeInfo {
            node_id: "n".into(),
            hostname: "h".into(),
            version: "3.9.1".into(),
            plugins: Vec::new(),
            process_conf: json!({}),
        };
        let rec = Arc::new(Recorder::default());
        let dp = DataPlane::new(conf(), node(), rec.clone(), &dir);
        // A whole config, then deltas each carrying a large entity, until they outweigh it.
        let mut prev =
            Reconfigure::build(json!({"_format_version": "3.0"}), Default::default()).unwrap();
        let first = dp.apply_message(&prev.deflated, true).unwrap().unwrap();
        assert!(first.starts_with("whole"), "{first}");
        let mut last = prev.hashes.config.clone();
        let mut i = 0;
        while !dp.compact.load(std::sync::atomic::Ordering::Relaxed) {
            i += 1;
            // Letters that do not compress (xorshift): each delta weighs ~12 KB gzipped.
            let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ i as u64;
            let noise: String = (0..20_000)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    char::from(b'a' + (x % 26) as u8)
                })
                .collect();
            let v = json!({"_format_version": "3.0", "consumers": [{"id": format!("c{i}"), "username": noise}]});
            let next = Reconfigure::build_after(v, Default::default(), Some(&prev)).unwrap();
            let d = next.delta.as_ref().unwrap();
            let what = dp.apply_message(&d.deflated, true).unwrap().unwrap();
            assert!(what.starts_with("delta"), "{what}");
            last = next.hashes.config.clone();
            prev = next;
            assert!(i < 100, "the deltas kept never outweighed the config");
        }
        assert!(i > 1);
        // A node started from what was kept ends at the same config.
        let rec2 = Arc::new(Recorder::default());
        let dp2 = DataPlane::new(conf(), node(), rec2.clone(), &dir);
        assert!(dp2.load_cache().unwrap());
        assert_eq!(dp2.applied_hash(), last);
        assert_eq!(rec2.0.lock().unwrap().len(), 1 + i);
        // The whole config sent on the next connection replaces the deltas.
        assert_eq!(dp.apply_message(&prev.deflated, true).unwrap(), None);
        assert!(!dp.deltas.exists());
        let dp3 = DataPlane::new(conf(), node(), Arc::new(Recorder::default()), &dir);
        assert!(dp3.load_cache().unwrap());
        assert_eq!(dp3.applied_hash(), last);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
