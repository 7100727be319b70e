//! A swarm of data planes for the hybrid-mode benchmark (`bench/hybrid.sh`): N clients of the
//! real protocol (`/v1/outlet`, shared-mode mutual TLS, `basic_info`, pings) in one process on
//! one control plane. Each write is a PATCH of a route through the control plane's Admin API;
//! the time from sending it to each client receiving the config that holds it is recorded.
//! Prints one JSON object: latencies (p50, p99, max), bytes per push, and the control plane's
//! RSS and CPU time (from /proc) before and after.
//!
//! Usage: dp_swarm CP_CLUSTER_ADDR CP_ADMIN_ADDR CERT KEY CP_PID N WRITES [ROUTE]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;
use turnpike_cluster::payload;
use turnpike_config::conf::{ClusterConf, ClusterMtls, Role};

/// What one client has received: (when, config hash, compressed bytes).
type Seen = Arc<Mutex<Vec<(Instant, String, usize)>>>;

fn proc_stat(pid: u32) -> (u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    (rss_kb, ticks as f64 / 100.0)
}

async fn http(addr: &str, method: &str, path: &str, body: &str) -> u16 {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("admin");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 8 {
        eprintln!("usage: dp_swarm CP_CLUSTER_ADDR CP_ADMIN_ADDR CERT KEY CP_PID N WRITES [ROUTE]");
        std::process::exit(2);
    }
    let (cp, admin) = (a[1].clone(), a[2].clone());
    let conf = ClusterConf {
        role: Role::DataPlane,
        listen: Vec::new(),
        control_plane: cp.clone(),
        cert: std::fs::read_to_string(&a[3]).unwrap(),
        cert_key: std::fs::read_to_string(&a[4]).unwrap(),
        ca_cert: None,
        mtls: ClusterMtls::Shared,
        server_name: None,
        max_payload: 1 << 30,
        data_plane_purge_delay: Duration::from_secs(1209600),
        dp_labels: Vec::new(),
        use_proxy: false,
        proxy_server: None,
    };
    let pid: u32 = a[5].parse().unwrap();
    let n: usize = a[6].parse().unwrap();
    let writes: usize = a[7].parse().unwrap();
    let route = a.get(8).cloned().unwrap_or_else(|| "bench-write".into());
    let (tls, name) = turnpike_cluster::tls::client_config(&conf).unwrap();
    let plugins: Vec<(String, String)> = [
        "key-auth",
        "rate-limiting",
        "acl",
        "basic-auth",
        "cors",
        "prometheus",
    ]
    .iter()
    .map(|p| (p.to_string(), "3.9.1".to_string()))
    .collect();
    let before = proc_stat(pid);
    let mut seen: Vec<Seen> = Vec::new();
    let mut ws_conf = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default();
    ws_conf.max_message_size = Some(1 << 30);
    ws_conf.max_frame_size = Some(1 << 30);
    for i in 0..n {
        let tcp = tokio::net::TcpStream::connect(&cp).await.expect("connect");
        let stream = tokio_rustls::TlsConnector::from(tls.clone())
            .connect(name.clone(), tcp)
            .await
            .expect("tls");
        let uri = format!(
            "wss://{cp}/v1/outlet?node_id=00000000-0000-4000-8000-{i:012}&node_hostname=swarm-{i}&node_version=3.9.1"
        );
        let (mut ws, _) = tokio_tungstenite::client_async_with_config(uri, stream, Some(ws_conf))
            .await
            .expect("ws");
        // SWARM_KONG=1: data planes as Kong's (the whole config on every change); else
        // Turnpike's (deltas).
        let caps: &[&str] = if std::env::var("SWARM_KONG").is_ok() {
            &[]
        } else {
            &[payload::DELTA_TYPE]
        };
        let info = payload::basic_info(&plugins, serde_json::json!({}), &[], caps);
        ws.send(Message::Binary(info.into())).await.unwrap();
        let log: Seen = Default::default();
        seen.push(log.clone());
        tokio::spawn(async move {
            while let Some(Ok(m)) = ws.next().await {
                if let Message::Binary(d) = m {
                    let at = Instant::now();
                    let text = payload::gunzip(&d, 1 << 30).unwrap();
                    let msg: payload::Received = serde_json::from_slice(&text).unwrap();
                    let hash = msg.hash().unwrap();
                    log.lock().unwrap().push((at, hash.clone(), d.len()));
                    let _ = ws.send(Message::Ping(hash.into_bytes().into())).await;
                }
            }
        });
    }
    // Every client has its first config.
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen.iter().any(|s| s.lock().unwrap().is_empty()) {
        assert!(Instant::now() < deadline, "not every client got a config");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let connected = proc_stat(pid);
    let mut latencies = Vec::new();
    let mut bytes = 0;
    for w in 0..writes {
        let counts: Vec<usize> = seen.iter().map(|s| s.lock().unwrap().len()).collect();
        let t0 = Instant::now();
        let body = format!("{{\"paths\":[\"/w-{w}\"]}}");
        let status = http(&admin, "PATCH", &format!("/routes/{route}"), &body).await;
        assert_eq!(status, 200, "PATCH /routes/{route}");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let done = seen
                .iter()
                .zip(&counts)
                .all(|(s, c)| s.lock().unwrap().len() > *c);
            if done {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "write {w} did not reach every client"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for (s, c) in seen.iter().zip(&counts) {
            let (at, _, len) = s.lock().unwrap()[*c].clone();
            latencies.push(at.duration_since(t0).as_secs_f64() * 1000.0);
            bytes = len;
        }
    }
    let after = proc_stat(pid);
    latencies.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "{}",
        serde_json::json!({
            "data_planes": n,
            "writes": writes,
            "p50_ms": percentile(&latencies, 0.5),
            "p99_ms": percentile(&latencies, 0.99),
            "max_ms": latencies.last().copied().unwrap_or(0.0),
            "bytes_per_push": bytes,
            "cp_rss_kb_before": before.0,
            "cp_rss_kb_connected": connected.0,
            "cp_rss_kb_per_data_plane": (connected.0 as f64 - before.0 as f64) / n as f64,
            "cp_cpu_s_connecting": connected.1 - before.1,
            "cp_cpu_s_per_write": (after.1 - connected.1) / writes.max(1) as f64,
        })
    );
}
