//! The two servers of the comparison: a raw upstream that logs what it receives and answers
//! as each case asks, and nginx in front of it, configured as Kong configures its proxy.

use super::*;

/// What the upstream received: one entry per request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Received {
    pub(super) method: String,
    pub(super) target: String,
    pub(super) body: Vec<u8>,
    pub(super) host: String,
    /// How many Content-Length lines the head carried.
    pub(super) length_lines: usize,
}

#[derive(Clone, Default)]
pub(super) struct Log(
    pub(super) Arc<Mutex<Vec<Received>>>,
    pub(super) Arc<std::sync::atomic::AtomicUsize>,
);

impl Log {
    pub(super) fn take(&self) -> Vec<Received> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

pub(super) struct RawUpstream {
    pub(super) addr: SocketAddr,
    pub(super) log: Log,
    pub(super) rt: Option<tokio::runtime::Runtime>,
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// `n` bytes of a pattern that shows misplaced or repeated ranges.
pub(super) fn pattern(n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| b"0123456789abcdefghijklmnopqrstuv"[(i * 7 + i / 1000) % 32])
        .collect()
}

impl RawUpstream {
    pub(super) fn start() -> RawUpstream {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let std_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_l.set_nonblocking(true).unwrap();
        let addr = std_l.local_addr().unwrap();
        let log = Log::default();
        let l2 = log.clone();
        rt.spawn(async move {
            let listener = TcpListener::from_std(std_l).unwrap();
            loop {
                let Ok((s, _)) = listener.accept().await else {
                    continue;
                };
                let log = l2.clone();
                tokio::spawn(async move {
                    let _ = upstream_conn(s, log).await;
                });
            }
        });
        RawUpstream {
            addr,
            log,
            rt: Some(rt),
        }
    }
}

/// Reads from `s` into `buf` until `buf` holds at least `n` bytes.
pub(super) async fn fill(s: &mut TcpStream, buf: &mut Vec<u8>, n: usize) -> std::io::Result<()> {
    let mut chunk = [0u8; 65536];
    while buf.len() < n {
        let k = s.read(&mut chunk).await?;
        if k == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..k]);
    }
    Ok(())
}

/// The index just past the first `\r\n\r\n` at or after `from`, reading more as needed.
pub(super) async fn until_blank_line(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    from: usize,
) -> std::io::Result<usize> {
    loop {
        if let Some(i) = buf[from..].windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok(from + i + 4);
        }
        let n = buf.len() + 1;
        fill(s, buf, n).await?;
    }
}

/// Reads a chunked body starting at `buf[0]`; returns (body, bytes consumed).
pub(super) async fn read_chunked(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> std::io::Result<(Vec<u8>, usize)> {
    let mut at = 0;
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(i) = buf[at..].windows(2).position(|w| w == b"\r\n") {
                break at + i;
            }
            let n = buf.len() + 1;
            fill(s, buf, n).await?;
        };
        let line = std::str::from_utf8(&buf[at..line_end]).unwrap_or("");
        let size = usize::from_str_radix(line.split(';').next().unwrap().trim(), 16)
            .map_err(|_| std::io::Error::other("bad chunk size"))?;
        at = line_end + 2;
        if size == 0 {
            // Trailers, then the blank line.
            let end = if buf.len() >= at + 2 && &buf[at..at + 2] == b"\r\n" {
                at + 2
            } else {
                fill(s, buf, at + 2).await?;
                if &buf[at..at + 2] == b"\r\n" {
                    at + 2
                } else {
                    until_blank_line(s, buf, at).await?
                }
            };
            return Ok((body, end));
        }
        fill(s, buf, at + size + 2).await?;
        body.extend_from_slice(&buf[at..at + size]);
        at += size + 2;
    }
}

pub(super) async fn upstream_conn(mut s: TcpStream, log: Log) -> std::io::Result<()> {
    let mut buf = Vec::new();
    loop {
        let end = match until_blank_line(&mut s, &mut buf, 0).await {
            Ok(e) => e,
            Err(_) => return Ok(()),
        };
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        req.parse(&buf[..end]).map_err(std::io::Error::other)?;
        let method = req.method.unwrap_or("").to_string();
        let target = req.path.unwrap_or("").to_string();
        let mut length = None;
        let mut chunked = false;
        let mut host = String::new();
        let mut expect = false;
        let mut length_lines = 0;
        for h in req.headers.iter() {
            let v = String::from_utf8_lossy(h.value).to_string();
            match h.name.to_ascii_lowercase().as_str() {
                "content-length" => {
                    length_lines += 1;
                    length = v.trim().parse::<usize>().ok()
                }
                "transfer-encoding" => chunked = v.to_ascii_lowercase().contains("chunked"),
                "host" => host = v,
                "expect" => expect = v.eq_ignore_ascii_case("100-continue"),
                _ => {}
            }
        }
        buf.drain(..end);
        if expect {
            s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
        }
        let body = if chunked {
            let (b, used) = read_chunked(&mut s, &mut buf).await?;
            buf.drain(..used);
            b
        } else {
            let n = length.unwrap_or(0);
            fill(&mut s, &mut buf, n).await?;
            buf.drain(..n).collect()
        };
        log.0.lock().unwrap().push(Received {
            method: method.clone(),
            target: target.clone(),
            body: body.clone(),
            host,
            length_lines,
        });
        let more = respond(&mut s, &method, &target, &body).await?;
        // Responses written whole (the client side may not have read them yet).
        log.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if !more {
            return Ok(());
        }
    }
}

/// Answers by the target's first segment; false when the connection is done.
pub(super) async fn respond(
    s: &mut TcpStream,
    method: &str,
    target: &str,
    body: &[u8],
) -> std::io::Result<bool> {
    let mut parts = target.trim_start_matches('/').splitn(3, '/');
    let kind = parts.next().unwrap_or("");
    let n: usize = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    let head_only = method == "HEAD";
    let data = pattern(n);
    let common = "x-up: yes\r\ncontent-type: application/octet-stream\r\n";
    let mut w = Vec::new();
    match kind {
        "len" => {
            w.extend_from_slice(
                format!("HTTP/1.1 200 OK\r\n{common}content-length: {n}\r\n\r\n").as_bytes(),
            );
            if !head_only {
                w.extend_from_slice(&data);
            }
        }
        "chunked" | "trailers" => {
            w.extend_from_slice(
                format!("HTTP/1.1 200 OK\r\n{common}transfer-encoding: chunked\r\n\r\n").as_bytes(),
            );
            if !head_only {
                for c in data.chunks(4000) {
                    w.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                    w.extend_from_slice(c);
                    w.extend_from_slice(b"\r\n");
                }
                w.extend_from_slice(b"0\r\n");
                if kind == "trailers" {
                    w.extend_from_slice(b"x-trailer: t\r\n");
                }
                w.extend_from_slice(b"\r\n");
            }
        }
        "close" => {
            w.extend_from_slice(
                format!("HTTP/1.1 200 OK\r\n{common}connection: close\r\n\r\n").as_bytes(),
            );
            if !head_only {
                w.extend_from_slice(&data);
            }
            s.write_all(&w).await?;
            return Ok(false);
        }
        "early" => {
            // Announces n bytes, sends half, closes.
            w.extend_from_slice(
                format!("HTTP/1.1 200 OK\r\n{common}content-length: {n}\r\n\r\n").as_bytes(),
            );
            w.extend_from_slice(&data[..n / 2]);
            s.write_all(&w).await?;
            return Ok(false);
        }
        "interim" => {
            w.extend_from_slice(
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n",
            );
            w.extend_from_slice(
                format!("HTTP/1.1 200 OK\r\n{common}content-length: {n}\r\n\r\n").as_bytes(),
            );
            w.extend_from_slice(&data);
        }
        "204" => w.extend_from_slice(format!("HTTP/1.1 204 No Content\r\n{common}\r\n").as_bytes()),
        "304" => w.extend_from_slice(
            format!("HTTP/1.1 304 Not Modified\r\n{common}etag: \"e\"\r\n\r\n").as_bytes(),
        ),
        _ => {
            // Echo: the request body back, with its length.
            w.extend_from_slice(
                format!(
                    "HTTP/1.1 200 OK\r\n{common}content-length: {}\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            );
            if !head_only {
                w.extend_from_slice(body);
            }
        }
    }
    s.write_all(&w).await?;
    Ok(true)
}

// ---------------------------------------------------------------------------------------------
// nginx, the reference.

pub struct Nginx {
    child: Child,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(super) fn nginx_bin() -> String {
    for p in ["/usr/sbin/nginx", "/usr/bin/nginx"] {
        if std::path::Path::new(p).exists() {
            return p.to_string();
        }
    }
    "nginx".into()
}

impl Nginx {
    /// nginx proxying everything to `upstream` the way Kong's template does.
    pub fn start(upstream: SocketAddr) -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let d = dir.path().display();
        let conf = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log warn;\nevents {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/cbt;\n  proxy_temp_path {d}/pt;\n\
             fastcgi_temp_path {d}/ft; uwsgi_temp_path {d}/ut; scgi_temp_path {d}/st;\n\
             client_max_body_size 0;\n  upstream up {{ server {upstream}; keepalive 60; }}\n\
             server {{\n    listen 127.0.0.1:{port};\n    location / {{\n\
             proxy_pass http://up;\n      proxy_http_version 1.1;\n\
             proxy_set_header Connection \"\";\n      proxy_set_header Host $host;\n\
             proxy_request_buffering on;\n      proxy_buffering on;\n    }}\n  }}\n}}\n"
        );
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, conf).unwrap();
        let mut child = Command::new(nginx_bin())
            .arg("-c")
            .arg(&path)
            .arg("-p")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx (Debian package nginx) is installed");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        for _ in 0..500 {
            if std::net::TcpStream::connect(addr).is_ok() {
                return Nginx {
                    child,
                    addr,
                    _dir: dir,
                };
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("nginx did not start");
    }
}

// ---------------------------------------------------------------------------------------------
// The client side: raw bytes out, responses parsed from what comes back.
