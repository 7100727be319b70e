//! Plugins on stream routes, as Kong runs them in its stream subsystem: configs whose
//! `protocols` list `tcp` (or `tls`, `tls_passthrough`, `udp`) run there; ip-restriction in
//! the preread phase (a refused session is closed, nothing sent back, the reason logged), the
//! log plugins (file-log, tcp-log, syslog) with Kong's stream log entry (`session`,
//! `upstream`, `latencies`, route, service, client_ip), on TCP and UDP sessions alike;
//! configs left at the default (HTTP) protocols do not run on streams.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::common::*;

async fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    addr
}

/// One exchange from the local address `from` (`127.0.0.x`): what came back.
async fn exchange_from(from: [u8; 4], to: SocketAddr, msg: &[u8]) -> Vec<u8> {
    let sock = TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::from((from, 0))).unwrap();
    let Ok(mut s) = sock.connect(to).await else {
        return Vec::new();
    };
    let _ = s.write_all(msg).await;
    let _ = s.shutdown().await;
    let mut back = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut back)).await;
    back
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_routes_run_their_preread_and_log_plugins() {
    let echo = echo_server().await;
    let (_dead_socket, dead) = dead_port();
    let (port, down_port) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let stream_log = dir.path().join("stream.log");
    let http_log = dir.path().join("http.log");
    // tcp-log's destination: a listener collecting what it receives.
    let collector = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector_port = collector.local_addr().unwrap().port();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = collector.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncBufReadExt;
                let mut lines = tokio::io::BufReader::new(&mut s).lines();
                while let Ok(Some(l)) = lines.next_line().await {
                    let _ = tx.send(l);
                }
            });
        }
    });
    let doc = json!({
        "_format_version": "3.0",
        "services": [
            {"name": "echo", "url": format!("tcp://{echo}"), "routes": [
                {"name": "guarded", "protocols": ["tcp"], "destinations": [{"port": port}],
                 "plugins": [
                    {"name": "ip-restriction", "protocols": ["tcp"], "config": {"allow": ["127.0.0.2"]}},
                    {"name": "file-log", "protocols": ["tcp"], "config": {
                        "path": stream_log.to_string_lossy(),
                        // Kong runs these in the stream subsystem's log phase too.
                        "custom_fields_by_lua": {
                            "peer": "return kong.client.get_ip()",
                            "session.route_name": "return kong.router.get_route().name",
                            "session.service_host": "return kong.router.get_service().host",
                            "status_seen": "return kong.response.get_status()",
                            "workspace": "return nil",
                            "no_request": "return kong.request.get_header('x')",
                        }}},
                    {"name": "tcp-log", "protocols": ["tcp"], "config": {"host": "127.0.0.1", "port": collector_port}},
                    {"name": "prometheus", "protocols": ["tcp"], "config": {"status_code_metrics": true, "latency_metrics": true}},
                 ]},
            ]},
            {"name": "down", "url": format!("tcp://127.0.0.1:{dead}"), "retries": 0, "routes": [
                {"name": "to-down", "protocols": ["tcp"], "destinations": [{"port": down_port}],
                 "plugins": [{"name": "file-log", "protocols": ["tcp"],
                              "config": {"path": stream_log.to_string_lossy()}}]},
            ]},
        ],
        // A global config at the default protocols (HTTP ones): not run on streams.
        "plugins": [{"name": "file-log", "config": {"path": http_log.to_string_lossy()}}],
    });
    let gw = Gateway::with_config(&doc.to_string())
        .env(
            "TURNPIKE_STREAM_LISTEN",
            &format!("127.0.0.1:{port}, 127.0.0.1:{down_port}"),
        )
        .start();
    let at = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
    assert!(
        eventually(Duration::from_secs(10), async || {
            TcpStream::connect(at(down_port)).await.is_ok()
        })
        .await
    );
    // The readiness probe above made a session (logged, 502): the test's entries follow it.
    let base = json_lines(&stream_log, 1).await.len();

    // Allowed: proxied, and logged as Kong's stream serializer writes it.
    let msg = vec![b'x'; 100_000];
    assert_eq!(exchange_from([127, 0, 0, 2], at(port), &msg).await, msg);
    let entry = json_lines(&stream_log, base + 1).await.remove(base);
    assert_eq!(entry["session"]["status"], 200, "{entry}");
    assert_eq!(entry["session"]["received"], 100_000);
    assert_eq!(entry["session"]["sent"], 100_000);
    assert_eq!(entry["session"]["server_port"], port);
    assert_eq!(entry["upstream"]["sent"], 100_000);
    assert_eq!(entry["upstream"]["received"], 100_000);
    assert_eq!(entry["client_ip"], "127.0.0.2");
    assert_eq!(entry["route"]["name"], "guarded");
    assert_eq!(entry["service"]["name"], "echo");
    assert!(entry["latencies"]["session"].as_u64().is_some());
    assert!(entry["started_at"].as_u64().unwrap() > 1_700_000_000_000);
    // custom_fields_by_lua on the stream entry: set, nested, removed; a PDK function a
    // stream has no use for (kong.request) fails that field alone, with a log line.
    assert_eq!(entry["peer"], "127.0.0.2", "{entry}");
    assert_eq!(entry["session"]["route_name"], "guarded", "{entry}");
    assert_eq!(entry["session"]["service_host"], "127.0.0.1", "{entry}");
    assert_eq!(entry["status_seen"], 200, "{entry}");
    assert!(entry.get("workspace").is_none() && entry.get("no_request").is_none());
    assert!(gw.log_text().contains("custom_fields_by_lua 'no_request'"));
    // Kong's `tries`: the balancer's one try, its peer and when its choice began.
    assert_eq!(entry["tries"].as_array().map(Vec::len), Some(1), "{entry}");
    let t = &entry["tries"][0];
    assert_eq!(
        (&t["ip"], &t["port"]),
        (&json!("127.0.0.1"), &json!(echo.port()))
    );
    assert!(t["balancer_start"].as_u64().unwrap() >= entry["started_at"].as_u64().unwrap());
    assert_eq!(
        t["balancer_start_ns"].as_u64().unwrap() / 1_000_000,
        t["balancer_start"].as_u64().unwrap()
    );
    assert!(
        t["balancer_latency_ns"].is_u64() && t.get("state").is_none(),
        "{t}"
    );
    let sent = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("tcp-log sent the entry")
        .unwrap();
    let sent: Value = serde_json::from_str(&sent).unwrap();
    assert_eq!(sent["session"]["received"], 100_000, "{sent}");

    // Refused by ip-restriction: closed with nothing sent back; logged with Kong's 403.
    assert!(exchange_from([127, 0, 0, 3], at(port), b"hello")
        .await
        .is_empty());
    let entry = json_lines(&stream_log, base + 2).await.remove(base + 1);
    assert_eq!(entry["session"]["status"], 403, "{entry}");
    assert_eq!(entry["client_ip"], "127.0.0.3");
    assert_eq!(entry["upstream"]["sent"], 0);
    assert!(
        entry.get("tries").is_none(),
        "refused before the balancer: {entry}"
    );
    assert!(gw
        .log_text()
        .contains("unable to proxy stream connection, status: 403"));

    // The service unreachable: 502.
    assert!(exchange_from([127, 0, 0, 1], at(down_port), b"hi")
        .await
        .is_empty());
    let entry = json_lines(&stream_log, base + 3).await.remove(base + 2);
    assert_eq!(entry["session"]["status"], 502, "{entry}");
    assert_eq!(entry["route"]["name"], "to-down");
    assert_eq!(entry["tries"].as_array().map(Vec::len), Some(1), "{entry}");
    assert_eq!(entry["tries"][0]["port"], dead);
    assert_eq!(entry["tries"][0]["state"], "failed");

    // prometheus on the stream route: Kong's stream families, with the workspace label.
    let metrics =
        String::from_utf8_lossy(&gw.admin("GET", "/metrics", None).await.body).into_owned();
    for line in [
        r#"kong_stream_sessions_total{service="echo",route="guarded",code="200",source="service",workspace="default"} 1"#,
        r#"kong_stream_sessions_total{service="echo",route="guarded",code="403",source="kong",workspace="default"} 1"#,
        r#"kong_session_duration_ms_count{service="echo",route="guarded",workspace="default"} 2"#,
        r#"kong_kong_latency_ms_count{service="echo",route="guarded",workspace="default"} 2"#,
    ] {
        assert!(metrics.contains(line), "{line} not in:\n{metrics}");
    }

    // The HTTP-only global file-log wrote nothing for any of these sessions.
    assert!(std::fs::read_to_string(&http_log)
        .unwrap_or_default()
        .is_empty());
    assert!(!gw.log_text().contains("panicked"));
}

/// syslog on a stream route: the session's entry by its status's severity (Kong 3.9's
/// handler reads `response.status`, which a stream entry lacks, and sends nothing; here 200
/// is successful, 502 a server error). Plugins on `udp` routes: ip-restriction refuses a
/// client's datagrams (the session logged with 403), an allowed client's session is logged
/// when it ends idle, with the bytes each way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syslog_on_streams_and_plugins_on_udp_sessions() {
    use tokio::net::UdpSocket;
    let echo = echo_server().await;
    let (_dead_socket, dead) = dead_port();
    let udp_echo = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let udp_echo_addr = udp_echo.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = udp_echo.recv_from(&mut buf).await {
            let mut out = b"re:".to_vec();
            out.extend_from_slice(&buf[..n]);
            let _ = udp_echo.send_to(&out, from).await;
        }
    });
    let (tcp_port, down_port, udp_port) = (free_port(), free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let udp_log = dir.path().join("udp.log");
    let sock_path = dir.path().join("log.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let syslog = json!({"name": "syslog", "protocols": ["tcp"],
                        "config": {"server_errors_severity": "crit", "syslog_facility": "LOCAL0"}});
    let doc = json!({
        "_format_version": "3.0",
        "services": [
            {"name": "echo", "url": format!("tcp://{echo}"), "routes": [
                {"name": "logged", "protocols": ["tcp"], "destinations": [{"port": tcp_port}],
                 "plugins": [syslog.clone()]},
            ]},
            {"name": "down", "url": format!("tcp://127.0.0.1:{dead}"), "retries": 0, "routes": [
                {"name": "to-down", "protocols": ["tcp"], "destinations": [{"port": down_port}],
                 "plugins": [syslog]},
            ]},
            {"name": "dns", "url": format!("udp://{udp_echo_addr}"),
             "read_timeout": 300, "write_timeout": 300, "routes": [
                {"name": "datagrams", "protocols": ["udp"], "destinations": [{"port": udp_port}],
                 "plugins": [
                    {"name": "ip-restriction", "protocols": ["udp"], "config": {"deny": ["127.0.0.3"]}},
                    {"name": "file-log", "protocols": ["udp"], "config": {"path": udp_log.to_string_lossy()}},
                 ]},
            ]},
        ],
    });
    let gw = Gateway::with_config(&doc.to_string())
        .env(
            "TURNPIKE_STREAM_LISTEN",
            &format!("127.0.0.1:{tcp_port}, 127.0.0.1:{down_port}, 127.0.0.1:{udp_port} udp"),
        )
        .env("TURNPIKE_SYSLOG_SOCKET", sock_path.to_str().unwrap())
        .start();
    let at = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
    assert!(
        eventually(Duration::from_secs(10), async || {
            TcpStream::connect(at(tcp_port)).await.is_ok()
        })
        .await
    );
    let mut buf = vec![0u8; 65536];
    let mut next_syslog = || {
        let n = sock.recv(&mut buf).expect("a syslog message");
        let msg = String::from_utf8_lossy(&buf[..n]).to_string();
        let (head, json) = msg.split_once(": ").unwrap();
        (
            head.to_string(),
            serde_json::from_str::<Value>(json).unwrap(),
        )
    };
    // The readiness probe's session (200, info: LOCAL0 = 16, <134>).
    let (head, entry) = next_syslog();
    assert!(
        head.starts_with("<134>") && head.contains(" kong["),
        "{head}"
    );
    assert_eq!(entry["session"]["status"], 200, "{entry}");
    // A session with bytes each way.
    assert_eq!(
        exchange_from([127, 0, 0, 1], at(tcp_port), b"hello").await,
        b"hello"
    );
    let (head, entry) = next_syslog();
    assert!(head.starts_with("<134>"), "{head}");
    assert_eq!(entry["session"]["received"], 5, "{entry}");
    assert_eq!(entry["upstream"]["received"], 5, "{entry}");
    assert_eq!(entry["route"]["name"], "logged");
    // The service down: 502, crit (<130>).
    assert!(exchange_from([127, 0, 0, 1], at(down_port), b"x")
        .await
        .is_empty());
    let (head, entry) = next_syslog();
    assert!(head.starts_with("<130>"), "{head}");
    assert_eq!(entry["session"]["status"], 502, "{entry}");

    // UDP: an allowed client's session, logged once idle past the 300 ms timeout.
    let ask = |from: [u8; 4], msg: &'static [u8]| async move {
        let c = UdpSocket::bind(SocketAddr::from((from, 0))).await.unwrap();
        let mut answers = Vec::new();
        for _ in 0..2 {
            c.send_to(msg, at(udp_port)).await.unwrap();
            let mut buf = [0u8; 2048];
            if let Ok(Ok((n, _))) =
                tokio::time::timeout(Duration::from_millis(500), c.recv_from(&mut buf)).await
            {
                answers.push(buf[..n].to_vec());
            }
        }
        answers
    };
    assert_eq!(
        ask([127, 0, 0, 2], b"ping").await,
        vec![b"re:ping".to_vec(), b"re:ping".to_vec()]
    );
    let entry = json_lines(&udp_log, 1).await.remove(0);
    assert_eq!(entry["session"]["status"], 200, "{entry}");
    assert_eq!(entry["session"]["received"], 8, "{entry}");
    assert_eq!(entry["session"]["sent"], 14, "{entry}");
    assert_eq!(entry["upstream"]["sent"], 8, "{entry}");
    assert_eq!(entry["upstream"]["received"], 14, "{entry}");
    assert_eq!(entry["client_ip"], "127.0.0.2");
    assert_eq!(entry["session"]["server_port"], udp_port);
    assert_eq!(entry["route"]["name"], "datagrams");
    assert_eq!(entry["tries"].as_array().map(Vec::len), Some(1), "{entry}");
    assert_eq!(entry["tries"][0]["ip"], "127.0.0.1", "{entry}");
    // A denied client gets nothing back; each datagram is a refused session, logged (403).
    assert!(ask([127, 0, 0, 3], b"no").await.is_empty());
    let got = json_lines(&udp_log, 3).await;
    for e in &got[1..3] {
        assert_eq!(e["session"]["status"], 403, "{e}");
        assert_eq!(e["client_ip"], "127.0.0.3");
        assert_eq!(e["upstream"]["sent"], 0);
    }
    assert!(gw
        .log_text()
        .contains("unable to proxy stream connection, status: 403"));
    assert!(!gw.log_text().contains("panicked"));
}
