//! Test harness: starts the real `turnpike` binary on free ports with a temp prefix, a real
//! upstream HTTP server (hyper, in this process), and talks HTTP to them.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};

pub mod dns;
pub mod pg;
pub mod redis;
pub mod slapd;

/// A port free now, and never handed out before in this test run: the kernel may give a port
/// it gave earlier (released at once), and two gateways on one port both bind it (their
/// listeners are `reuseport`), which sent one test's requests to another test's gateway.
pub fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut handed = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if !handed.contains(&port) {
            handed.push(port);
            return port;
        }
    }
}

/// A port that refuses connections for as long as the returned socket lives: bound, never
/// listening, so no other server (another test's gateway or upstream picking a free port) can
/// take it and answer where a test expects a dead target.
pub fn dead_port() -> (socket2::Socket, u16) {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    let port = s.local_addr().unwrap().as_socket().unwrap().port();
    (s, port)
}

/// A real upstream: echoes what it received as JSON; `/status/N` answers N; `/delay/MS`
/// sleeps first; `/bytes/N` streams N bytes; `/ws` accepts a WebSocket-style upgrade and
/// echoes raw bytes. Counts the TCP connections it accepted and the requests it answered.
pub struct Upstream {
    pub addr: SocketAddr,
    pub connections: Arc<AtomicUsize>,
    pub requests: Arc<AtomicUsize>,
    pub name: String,
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        // Tests drop upstreams inside their own runtime: don't block there.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Upstream {
    pub fn start(name: &str) -> Upstream {
        Self::start_on(name, 0)
    }

    pub fn start_on(name: &str, port: u16) -> Upstream {
        Self::start_with(
            name,
            SocketAddr::from(([127, 0, 0, 1], port)),
            Duration::ZERO,
        )
    }

    /// An upstream on another address (127.0.0.2 is loopback too on Linux).
    pub fn start_at(name: &str, addr: SocketAddr) -> Upstream {
        Self::start_with(name, addr, Duration::ZERO)
    }

    /// An upstream that waits `delay` before answering every request (a slow target).
    pub fn start_with_delay(name: &str, delay: Duration) -> Upstream {
        Self::start_with(name, SocketAddr::from(([127, 0, 0, 1], 0)), delay)
    }

    fn start_with(name: &str, addr: SocketAddr, delay: Duration) -> Upstream {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let std_listener = std::net::TcpListener::bind(addr).unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let conns = connections.clone();
        let requests = Arc::new(AtomicUsize::new(0));
        let reqs = requests.clone();
        let name_owned = name.to_string();
        rt.spawn(async move {
            let listener = TcpListener::from_std(std_listener).unwrap();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                conns.fetch_add(1, Ordering::SeqCst);
                let name = name_owned.clone();
                let reqs = reqs.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let name = name.clone();
                        reqs.fetch_add(1, Ordering::SeqCst);
                        async move {
                            if !delay.is_zero() {
                                tokio::time::sleep(delay).await;
                            }
                            upstream_handler(name, req).await
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .with_upgrades()
                        .await;
                });
            }
        });
        Upstream {
            addr,
            connections,
            requests,
            name: name.to_string(),
            rt: Some(rt),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

async fn upstream_handler(
    name: String,
    mut req: Request<Incoming>,
) -> Result<Response<UpBody>, hyper::Error> {
    let path = req.uri().path().to_string();
    if path == "/ws" {
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(up) = upgrade.await {
                let mut io = TokioIo::new(up);
                let (mut r, mut w) = tokio::io::split(&mut io);
                let _ = tokio::io::copy(&mut r, &mut w).await;
            }
        });
        let r = Response::builder()
            .status(101)
            .header("connection", "upgrade")
            .header("upgrade", "websocket")
            .body(UpBody::Full(Full::new(Bytes::new())))
            .unwrap();
        return Ok(r);
    }
    if let Some(ms) = path.strip_prefix("/delay/") {
        let ms: u64 = ms.split('/').next().unwrap_or("0").parse().unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if let Some(n) = path.strip_prefix("/bytes/") {
        let n: usize = n.parse().unwrap_or(0);
        let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
        tokio::spawn(async move {
            let mut left = n;
            while left > 0 {
                let k = left.min(chunk.len());
                if tx.send(chunk.slice(..k)).await.is_err() {
                    return;
                }
                left -= k;
            }
        });
        return Ok(Response::new(UpBody::Stream(rx)));
    }
    let status: u16 = path
        .strip_prefix("/status/")
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let method = req.method().to_string();
    let uri = req.uri().to_string();
    let mut headers = BTreeMap::new();
    for (k, v) in req.headers() {
        headers
            .entry(k.as_str().to_string())
            .or_insert_with(|| String::from_utf8_lossy(v.as_bytes()).to_string());
    }
    let body = req.into_body().collect().await?.to_bytes();
    let sum: u64 = body
        .iter()
        .fold(0u64, |a, b| a.wrapping_mul(31).wrapping_add(*b as u64));
    let json = serde_json::json!({
        "upstream": name, "method": method, "uri": uri, "headers": headers,
        "body_len": body.len(), "body_sum": sum,
    });
    let mut r = Response::builder();
    if path.starts_with("/kong-named") {
        // An upstream that sends headers named like Kong's own (the gateway replaces them).
        r = r
            .header("x-kong-upstream-latency", "999")
            .header("x-kong-request-id", "from-upstream");
    }
    if let Some(spent) = path.strip_prefix("/limit/") {
        // response-ratelimiting: what the upstream says this response spent.
        r = r.header("x-kong-limit", spent.replace("%20", " "));
    }
    let json = json.to_string();
    if path.starts_with("/sized") {
        // An upstream that announces its body's length (the others stream, chunked).
        r = r.header("content-length", json.len());
    }
    let r = r
        .status(status)
        .header("content-type", "application/json")
        .header("x-upstream", name)
        .body(UpBody::Full(Full::new(Bytes::from(json))))
        .unwrap();
    Ok(r)
}

/// The upstream's body: a fixed buffer, or chunks streamed from a channel.
pub enum UpBody {
    Full(Full<Bytes>),
    Stream(tokio::sync::mpsc::Receiver<Bytes>),
}

impl hyper::body::Body for UpBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            UpBody::Full(f) => std::pin::Pin::new(f).poll_frame(cx),
            UpBody::Stream(rx) => rx
                .poll_recv(cx)
                .map(|o| o.map(|b| Ok(hyper::body::Frame::data(b)))),
        }
    }
}

/// A running gateway process, killed on drop.
pub struct Gateway {
    pub child: Child,
    pub proxy: SocketAddr,
    pub proxy_tls: SocketAddr,
    pub admin: SocketAddr,
    pub dir: tempfile::TempDir,
    pub log: PathBuf,
    pub config_file: PathBuf,
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_turnpike")
}

pub struct GatewayBuilder {
    yaml: String,
    env: Vec<(String, String)>,
    /// More flags on both proxy listeners (`proxy_protocol`).
    proxy_flags: String,
}

impl GatewayBuilder {
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    /// Flags added to both proxy listeners (Kong's listen syntax, e.g. `proxy_protocol`).
    pub fn proxy_flags(mut self, flags: &str) -> Self {
        self.proxy_flags = format!(" {flags}");
        self
    }

    pub fn start(self) -> Gateway {
        self.start_with(false)
    }

    /// Like `start`, with the http2 flag on the plain listener too (h2c prior knowledge).
    pub fn start_h2(self) -> Gateway {
        self.start_with(true)
    }

    fn start_with(self, h2c: bool) -> Gateway {
        // A port picked free can be taken by another test before the gateway binds it: start
        // again on other ports when that is why it stopped.
        for attempt in 0.. {
            let mut gw = self.spawn(h2c);
            match gw.wait_ready() {
                Ok(()) => return gw,
                Err(log) if attempt < 3 && log.contains("cannot bind") => continue,
                Err(log) => panic!("gateway did not start:\n{log}"),
            }
        }
        unreachable!()
    }

    fn spawn(&self, h2c: bool) -> Gateway {
        let dir = tempfile::tempdir().unwrap();
        let config_file = dir.path().join("kong.yml");
        std::fs::write(&config_file, &self.yaml).unwrap();
        let (p, t, a) = (free_port(), free_port(), free_port());
        let log = dir.path().join("turnpike.log");
        let mut cmd = Command::new(bin());
        cmd.arg("start")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("TURNPIKE_PREFIX", dir.path().join("prefix"))
            .env(
                "TURNPIKE_PROXY_LISTEN",
                format!(
                    "127.0.0.1:{p} reuseport{}{f}, 127.0.0.1:{t} ssl http2 reuseport{f}",
                    if h2c { " http2" } else { "" },
                    f = self.proxy_flags,
                ),
            )
            .env("TURNPIKE_ADMIN_LISTEN", format!("127.0.0.1:{a}"))
            .env("TURNPIKE_DECLARATIVE_CONFIG", &config_file)
            // DB-less unless a test asks for a store (its env below overrides this).
            .env("TURNPIKE_DATABASE", "off")
            .env("TURNPIKE_NGINX_WORKER_PROCESSES", "2")
            .env("TURNPIKE_LOG_LEVEL", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start turnpike");
        Gateway {
            child,
            proxy: format!("127.0.0.1:{p}").parse().unwrap(),
            proxy_tls: format!("127.0.0.1:{t}").parse().unwrap(),
            admin: format!("127.0.0.1:{a}").parse().unwrap(),
            dir,
            log,
            config_file,
        }
    }
}

impl Gateway {
    pub fn with_config(yaml: &str) -> GatewayBuilder {
        GatewayBuilder {
            yaml: yaml.to_string(),
            env: Vec::new(),
            proxy_flags: String::new(),
        }
    }

    /// Until both listeners answer; `Err(log)` when the process stopped or took too long.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(self.admin).is_ok()
                && std::net::TcpStream::connect(self.proxy).is_ok()
            {
                if self.proxy_port_shared() {
                    return Err(
                        "cannot bind: a proxy port picked free is shared with another \
                                process (reuseport)"
                            .into(),
                    );
                }
                return Ok(());
            }
            if let Ok(Some(_)) = self.child.try_wait() {
                return Err(self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(self.log_text())
    }

    /// Whether a socket listening on one of the proxy ports belongs to another process: two
    /// gateways' `reuseport` listeners can share a port both picked free, and a request then
    /// reaches the other one (seen as a TLS listener's bytes on the plain port).
    pub fn proxy_port_shared(&self) -> bool {
        let ports = [self.proxy.port(), self.proxy_tls.port()];
        let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
            return false;
        };
        let listening: Vec<&str> = table
            .lines()
            .skip(1)
            .filter_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let port = f.get(1)?.rsplit(':').next()?;
                let port = u16::from_str_radix(port, 16).ok()?;
                // State 0A: LISTEN; field 9: the socket's inode.
                (f.get(3) == Some(&"0A") && ports.contains(&port)).then(|| f.get(9).copied())?
            })
            .collect();
        let Ok(fds) = std::fs::read_dir(format!("/proc/{}/fd", self.child.id())) else {
            return false;
        };
        let ours: Vec<String> = fds
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter_map(|l| {
                let l = l.to_string_lossy().into_owned();
                Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
            })
            .collect();
        listening.iter().any(|i| !ours.iter().any(|o| o == i))
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(ok.success());
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub async fn status(&self) -> serde_json::Value {
        let r = send(
            self.admin,
            req("GET", "/status").body(Full::new(Bytes::new())).unwrap(),
        )
        .await;
        serde_json::from_slice(&r.body).unwrap()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

pub fn req(method: &str, path: &str) -> http::request::Builder {
    Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
}

/// One request over a new HTTP/1.1 connection.
pub async fn send<B>(addr: SocketAddr, request: Request<B>) -> Reply
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let resp = h1_client(addr).await.0.send_request(request).await.unwrap();
    collect(resp).await
}

/// A keep-alive HTTP/1.1 client connection; the connection task's handle is returned too.
pub async fn h1_client<B>(
    addr: SocketAddr,
) -> (
    hyper::client::conn::http1::SendRequest<B>,
    tokio::task::JoinHandle<hyper::Result<()>>,
)
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    (sender, tokio::spawn(conn))
}

/// An HTTP/2 connection with prior knowledge (h2c) to a listener with the http2 flag.
pub async fn h2c_client<B>(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<B>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}

pub async fn collect(resp: Response<Incoming>) -> Reply {
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Reply {
        status,
        headers,
        body,
    }
}

/// `n` concurrent GETs of `path`, spread in turn over `addrs`: how many got each status.
pub async fn concurrent_statuses(
    addrs: &[SocketAddr],
    path: &str,
    n: usize,
) -> BTreeMap<u16, usize> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (addr, path) = (addrs[i % addrs.len()], path.to_string());
            tokio::spawn(async move { call(addr, "GET", &path, &[]).await.status })
        })
        .collect();
    let mut counts = BTreeMap::new();
    for t in tasks {
        *counts.entry(t.await.unwrap()).or_default() += 1;
    }
    counts
}

/// A request without a body, with these headers.
pub async fn call(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let raw: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
    call_raw(addr, method, path, &raw).await
}

/// Like `call`, with header values as raw bytes (some tests send values that are not text).
pub async fn call_raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &[u8])],
) -> Reply {
    let mut b = req(method, path);
    for (k, v) in headers {
        b = b.header(*k, http::HeaderValue::from_bytes(v).unwrap());
    }
    send(addr, b.body(Full::new(Bytes::new())).unwrap()).await
}

pub async fn get(addr: SocketAddr, host: &str, path: &str) -> Reply {
    send(
        addr,
        Request::get(path)
            .header("host", host)
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await
}

/// A TLS client that accepts any certificate (the proxy's own unverified client
/// configuration, with the ALPN protocols asked for).
pub fn tls_client(alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
    let mut cfg = (*turnpike_proxy::tls::unverified_client_config()).clone();
    cfg.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    // Full handshakes only: a resumed session shows the certificate of the session it
    // resumes, not the one the gateway would choose now.
    cfg.resumption = rustls::client::Resumption::disabled();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

/// A GET over TLS with the given SNI; returns the reply, the certificate's DER and the ALPN.
pub async fn get_tls(
    addr: SocketAddr,
    sni: &str,
    path: &str,
    h2: bool,
) -> (Reply, Vec<u8>, Option<Vec<u8>>) {
    let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
    let stream = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from(sni.to_string()).unwrap();
    let tls = tls_client(alpn).connect(name, stream).await.unwrap();
    let (_, session) = tls.get_ref();
    let cert = session.peer_certificates().unwrap()[0].to_vec();
    let proto = session.alpn_protocol().map(|p| p.to_vec());
    let reply = if h2 {
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .unwrap();
        tokio::spawn(conn);
        let uri = format!("https://{sni}{path}");
        let resp = sender
            .send_request(Request::get(uri).body(Full::new(Bytes::new())).unwrap())
            .await
            .unwrap();
        collect(resp).await
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .unwrap();
        tokio::spawn(conn);
        let resp = sender
            .send_request(
                Request::get(path)
                    .header("host", sni)
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
            .await
            .unwrap();
        collect(resp).await
    };
    (reply, cert, proto)
}

/// Self-signed certificate and key PEMs for `name`.
pub fn cert_for(name: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// The certificates of a PEM chain.
pub fn pem_certs(pem: &str) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(|c| c.unwrap())
        .collect()
}

/// Runs the binary with arguments; returns (exit success, stdout + stderr).
pub fn run(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        // DB-less unless the caller names a database.
        .env("TURNPIKE_DATABASE", "off");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

impl Gateway {
    /// A gateway on the embedded SQLite store (no declarative file).
    pub fn sqlite() -> GatewayBuilder {
        Gateway::with_config("_format_version: \"3.0\"\n").env("TURNPIKE_DATABASE", "sqlite")
    }

    /// An Admin API call with an optional JSON body.
    pub async fn admin(&self, method: &str, path: &str, body: Option<serde_json::Value>) -> Reply {
        admin_call(self.admin, method, path, body).await
    }
}

/// An Admin API call to `addr` with an optional JSON body.
pub async fn admin_call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> Reply {
    let b = req(method, path);
    let r = match body {
        Some(v) => b
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(v.to_string())))
            .unwrap(),
        None => b.body(Full::new(Bytes::new())).unwrap(),
    };
    send(addr, r).await
}

/// `POST /plugins` of plugin `name` with `config` (a global plugin).
pub async fn post_plugin(admin: SocketAddr, name: &str, config: serde_json::Value) -> Reply {
    admin_call(
        admin,
        "POST",
        "/plugins",
        Some(serde_json::json!({"name": name, "config": config})),
    )
    .await
}

/// Raw-body Admin API call (forms, broken JSON).
pub async fn admin_raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    ct: &str,
    body: Vec<u8>,
) -> Reply {
    let r = req(method, path)
        .header("content-type", ct)
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    send(addr, r).await
}

/// Polls `f` until it is true or `limit` passes.
pub async fn eventually(limit: Duration, mut f: impl AsyncFnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

/// Waits (10 s at most) until `path` on `proxy` answers `status`: Admin API writes are applied
/// asynchronously, as in Kong. Returns the last reply.
pub async fn until_status(proxy: SocketAddr, path: &str, status: u16) -> Reply {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = get(proxy, "x", path).await;
        if r.status == status || Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

impl Gateway {
    /// A target's health as `GET /upstreams/{upstream}/health` reports it ("" when absent).
    pub async fn health_of(&self, upstream: &str, target: &str) -> String {
        let r = self
            .admin("GET", &format!("/upstreams/{upstream}/health"), None)
            .await;
        r.json()["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["target"] == target)
            .map(|t| t["health"].as_str().unwrap().to_string())
            .unwrap_or_default()
    }

    /// Creates service `s` (to `url`) and its route `r` on `path` through the Admin API.
    pub async fn add_service_route(&self, url: &str, path: &str) {
        let r = self
            .admin(
                "POST",
                "/services",
                Some(serde_json::json!({"name": "s", "url": url})),
            )
            .await;
        assert_eq!(r.status, 201, "{:?}", r.body);
        let r = self
            .admin(
                "POST",
                "/services/s/routes",
                Some(serde_json::json!({"name": "r", "paths": [path]})),
            )
            .await;
        assert_eq!(r.status, 201, "{:?}", r.body);
    }
}

/// Builds the Go program in `tests/integration/<dir>` (the Go toolchain and the module proxy,
/// cached between runs) into the target directory as `name`: its path.
pub fn go_build(dir: &str, name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/integration")
        .join(dir);
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let path = format!(
        "{}:/usr/local/go/bin",
        std::env::var("PATH").unwrap_or_default()
    );
    let built = Command::new("go")
        .args(["build", "-o"])
        .arg(&out)
        .arg(".")
        .current_dir(&src)
        .env("PATH", path)
        .env("GOFLAGS", "-mod=mod")
        .output()
        .expect("run go build (the Go toolchain is needed)");
    assert!(
        built.status.success(),
        "building {dir} failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    out
}

/// The file's JSON lines once there are `n` of them.
pub async fn json_lines(path: &std::path::Path, n: usize) -> Vec<serde_json::Value> {
    for _ in 0..200 {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let got: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if got.len() >= n {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("fewer than {n} log lines in {}", path.display());
}

/// `PYTHONPATH` for a Python that can `import module`: the system's when it can, else
/// `package` installed from PyPI into the target directory (`dir`), once per target directory.
pub fn python_with(module: &str, package: &str, dir: &str) -> String {
    let has = |path: &str| {
        Command::new("python3")
            .args(["-c", &format!("import {module}")])
            .env("PYTHONPATH", path)
            .status()
            .is_ok_and(|s| s.success())
    };
    if has("") {
        return String::new();
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(dir);
    let dir = dir.to_string_lossy().into_owned();
    if !has(&dir) {
        let ok = Command::new("python3")
            .args(["-m", "pip", "install", "-q", "--target", &dir, package])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "pip install {package} failed");
    }
    dir
}

/// `node_modules` in the target directory (`dir`) holding `packages` (`name@version`) from the
/// npm registry, installed once (when one of them is missing).
pub fn node_modules_with(dir: &str, packages: &[&str]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(dir);
    let modules = dir.join("node_modules");
    let missing = packages.iter().any(|p| {
        let name = p.rsplit_once('@').map_or(*p, |(n, _)| n);
        !modules.join(name).exists()
    });
    if missing {
        std::fs::create_dir_all(&dir).unwrap();
        let ok = Command::new("npm")
            .args([
                "install",
                "--no-save",
                "--no-audit",
                "--no-fund",
                "--prefix",
            ])
            .arg(&dir)
            .args(packages)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "npm install {packages:?} failed");
    }
    modules
}
