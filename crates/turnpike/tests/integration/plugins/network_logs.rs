//! tcp-log and udp-log on the real binary: each request's entry, Kong's serialized JSON,
//! arrives at receivers the test listens with (a TCP listener reading lines, a TLS one with a
//! self-signed certificate, a UDP socket reading datagrams); a receiver that is down costs the
//! request nothing.

use std::io::{BufRead, BufReader};
use std::time::Duration;

use crate::common::*;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_reach_tcp_and_udp_receivers() {
    let up = Upstream::start("netlog");
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (dead, dead_port) = dead_port();
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: logged
    paths: [/logged]
    plugins:
    - name: tcp-log
      config: {{host: 127.0.0.1, port: {tcp}}}
    - name: udp-log
      config: {{host: localhost, port: {udp}, custom_fields_by_lua: {{via: "return 'udp'"}}}}
  - name: nowhere
    paths: [/nowhere]
    plugins:
    - name: tcp-log
      config: {{host: 127.0.0.1, port: {dead_port}, timeout: 200}}
- name: refusing
  url: http://127.0.0.1:{dead_port}
  retries: 1
  routes:
  - name: refused
    paths: [/refused]
    plugins:
    - name: tcp-log
      config: {{host: 127.0.0.1, port: {tcp}}}
"#,
        url = up.url(),
        tcp = tcp.local_addr().unwrap().port(),
        udp = udp.local_addr().unwrap().port(),
    ))
    .start();
    let r = call(
        gw.proxy,
        "GET",
        "/logged?a=1",
        &[("authorization", "secret")],
    )
    .await;
    assert_eq!(r.status, 200);

    let (conn, _) = tcp.accept().unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut lines = BufReader::new(conn);
    let mut line = String::new();
    lines.read_line(&mut line).unwrap();
    assert!(line.ends_with('\n'), "one JSON document per line");
    let e: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(e["request"]["uri"], "/logged?a=1");
    assert_eq!(e["response"]["status"], 200);
    assert_eq!(e["route"]["name"], "logged");
    assert_eq!(e["request"]["headers"]["authorization"], "REDACTED");

    let mut buf = vec![0u8; 65536];
    let n = udp.recv(&mut buf).unwrap();
    let e: Value = serde_json::from_slice(&buf[..n]).unwrap();
    assert_eq!(e["request"]["uri"], "/logged?a=1");
    assert_eq!(e["via"], "udp", "custom_fields_by_lua");

    // The same connection carries the next entry (keepalive).
    call(gw.proxy, "GET", "/logged?b=2", &[]).await;
    line.clear();
    lines.read_line(&mut line).unwrap();
    let e: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(e["request"]["uri"], "/logged?b=2");

    // Kong's `tries` for a peer that refuses: two tries (retries 1), both failed with their
    // state and code, on the same receiver connection.
    assert_eq!(call(gw.proxy, "GET", "/refused", &[]).await.status, 502);
    line.clear();
    lines.read_line(&mut line).unwrap();
    let e: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(e["request"]["uri"], "/refused");
    let tries = e["tries"].as_array().expect("tries");
    assert_eq!(tries.len(), 2, "{e}");
    for t in tries {
        assert_eq!(t["port"], dead_port as u64);
        assert_eq!(t["state"], "failed");
        assert_eq!(t["code"], 502);
    }

    // A receiver that refuses connections: requests are served all the same.
    for _ in 0..3 {
        assert_eq!(call(gw.proxy, "GET", "/nowhere", &[]).await.status, 200);
    }
    drop(dead);
    // The sender runs beside the requests: its failure is logged soon after, not before
    // the responses.
    assert!(
        eventually(Duration::from_secs(10), async || gw
            .log_text()
            .contains("tcp-log: cannot connect"))
        .await,
        "the failure is logged"
    );
}

/// What a TLS receiver saw of one connection: the name the client asked for (SNI) and the
/// first line it sent.
type Received = (Option<String>, String);

/// A TLS receiver with a self-signed certificate, for `n` connections.
fn tls_receiver(n: usize) -> (u16, std::thread::JoinHandle<Vec<Received>>) {
    let (cert, key) = cert_for("logs.example");
    let certs = pem_certs(&cert);
    use rustls::pki_types::pem::PemObject;
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let config = std::sync::Arc::new(
        rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap(),
    );
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let t = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for _ in 0..n {
            let (tcp, _) = l.accept().unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let conn = rustls::ServerConnection::new(config.clone()).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, tcp);
            let mut line = String::new();
            BufReader::new(&mut tls).read_line(&mut line).unwrap();
            seen.push((tls.conn.server_name().map(String::from), line));
        }
        seen
    });
    (port, t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_log_speaks_tls_to_self_signed_receivers_as_kong_does() {
    let up = Upstream::start("tlslog");
    let (named, named_rx) = tls_receiver(1);
    let (bare, bare_rx) = tls_receiver(1);
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: named
    paths: [/named]
    plugins:
    - name: tcp-log
      config: {{host: 127.0.0.1, port: {named}, tls: true, tls_sni: logs.example}}
  - name: bare
    paths: [/bare]
    plugins:
    - name: tcp-log
      config: {{host: localhost, port: {bare}, tls: true}}
"#,
        url = up.url(),
    ))
    .start();
    assert_eq!(call(gw.proxy, "GET", "/named?x=1", &[]).await.status, 200);
    assert_eq!(call(gw.proxy, "GET", "/bare?y=2", &[]).await.status, 200);
    // Kong does not verify the receiver's certificate: a self-signed one gets the entries.
    let named = named_rx.join().unwrap();
    assert_eq!(
        named[0].0.as_deref(),
        Some("logs.example"),
        "tls_sni is sent"
    );
    let e: Value = serde_json::from_str(&named[0].1).unwrap();
    assert_eq!(e["request"]["uri"], "/named?x=1");
    let bare = bare_rx.join().unwrap();
    assert_eq!(
        bare[0].0, None,
        "no tls_sni, no server name (Kong passes nil)"
    );
    let e: Value = serde_json::from_str(&bare[0].1).unwrap();
    assert_eq!(e["request"]["uri"], "/bare?y=2");
}

/// A UDP socket on a free port that gives up a read after 500 ms.
fn udp_receiver() -> std::net::UdpSocket {
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    udp
}

/// Datagrams until `want` lines arrived (or 10 s passed).
fn datagrams(udp: &std::net::UdpSocket, want: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut buf = vec![0u8; 65536];
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while lines.len() < want && std::time::Instant::now() < until {
        if let Ok(n) = udp.recv(&mut buf) {
            lines.extend(
                String::from_utf8_lossy(&buf[..n])
                    .split('\n')
                    .map(String::from),
            );
        }
    }
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statsd_sends_kongs_metric_names() {
    let up = Upstream::start("statsd");
    let udp = udp_receiver();
    let packed = udp_receiver();
    let tagged = udp_receiver();
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
consumers:
- username: alice
  custom_id: cust-1
  keyauth_credentials: [{{key: alice-key}}]
services:
- name: my.api
  url: {url}
  routes:
  - name: r
    paths: [/m]
    plugins:
    - name: key-auth
    - name: statsd
      config: {{host: 127.0.0.1, port: {udp}}}
  - name: packed
    paths: [/packed]
    plugins:
    - name: statsd
      config:
        host: 127.0.0.1
        port: {packed}
        prefix: gw
        udp_packet_size: 1000
        allow_status_codes: ["200-299"]
        metrics:
        - {{name: request_count, stat_type: counter, sample_rate: 0.5}}
        - {{name: status_count, stat_type: counter, sample_rate: 1, service_identifier: service_host}}
  - name: tagged
    paths: [/tagged]
    plugins:
    - name: key-auth
    - name: statsd
      config: {{host: 127.0.0.1, port: {tagged}, tag_style: dogstatsd, hostname_in_prefix: true}}
  - name: influx
    paths: [/influx]
    plugins:
    - name: statsd
      config:
        host: 127.0.0.1
        port: {tagged}
        tag_style: influxdb
        metrics:
        - {{name: request_count, stat_type: counter, sample_rate: 1, workspace_identifier: workspace_name}}
        - {{name: status_count, stat_type: counter, sample_rate: 1}}
"#,
        url = up.url(),
        udp = udp.local_addr().unwrap().port(),
        packed = packed.local_addr().unwrap().port(),
        tagged = tagged.local_addr().unwrap().port(),
    ))
    .start();
    let r = call(gw.proxy, "GET", "/m", &[("apikey", "alice-key")]).await;
    assert_eq!(r.status, 200);
    let lines = datagrams(&udp, 12);
    let has = |prefix: &str| lines.iter().any(|l| l.starts_with(prefix));
    for want in [
        "kong.service.my_api.request.count:1|c",
        "kong.service.my_api.status.200:1|c",
        "kong.service.my_api.user.uniques:cust-1|s",
        "kong.service.my_api.user.cust-1.request.count:1|c",
        "kong.service.my_api.user.cust-1.status.200:1|c",
        "kong.service.my_api.workspace.default.status.200:1|c",
    ] {
        assert!(lines.iter().any(|l| l == want), "{want} in {lines:?}");
    }
    for timer in [
        "kong.service.my_api.latency:",
        "kong.service.my_api.upstream_latency:",
        "kong.service.my_api.kong_latency:",
    ] {
        assert!(
            has(timer)
                && lines
                    .iter()
                    .any(|l| l.starts_with(timer) && l.ends_with("|ms")),
            "{timer} in {lines:?}"
        );
    }
    assert!(has("kong.service.my_api.request.size:") && has("kong.service.my_api.response.size:"));
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("kong.route.") && l.ends_with(".user.cust-1.status.200:1|c")),
        "{lines:?}"
    );

    // Packed into one datagram, a sample rate, the service's host; a 404 is not counted.
    call(gw.proxy, "GET", "/packed/missing-is-fine", &[]).await;
    let mut buf = vec![0u8; 65536];
    let n = packed.recv(&mut buf).unwrap();
    let text = String::from_utf8_lossy(&buf[..n]).to_string();
    assert_eq!(
        text, "gw.service.my_api.request.count:1|c|@0.5\ngw.service.127_0_0_1.status.200:1|c",
        "one datagram"
    );
    call(gw.proxy, "GET", "/packed/status/404", &[]).await;
    assert!(
        packed.recv(&mut buf).is_err(),
        "allow_status_codes leaves the 404 out"
    );

    // tag_style: the metric's own name, tagged (the host is the node tag, not in the prefix);
    // the per-consumer and per-status metrics are not sent in that mode.
    let node = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .replace('.', "_");
    let consumer = gw.admin("GET", "/consumers/alice", None).await.json()["custom_id"]
        .as_str()
        .unwrap()
        .to_string();
    call(gw.proxy, "GET", "/tagged", &[("apikey", "alice-key")]).await;
    let lines = datagrams(&tagged, 6);
    let tags = format!(
        "service:my.api,route:tagged,workspace:00000000-0000-0000-0000-000000000000,consumer:{consumer},node:{node},status:200"
    );
    assert!(
        lines
            .iter()
            .any(|l| *l == format!("kong.request.count:1|c|#{tags}")),
        "{lines:?}"
    );
    for stat in [
        "latency",
        "upstream_latency",
        "kong_latency",
        "request.size",
        "response.size",
    ] {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("kong.{stat}:"))
                    && l.ends_with(&format!("|#{tags}"))),
            "{stat} in {lines:?}"
        );
    }
    assert_eq!(lines.len(), 6, "{lines:?}");
    call(gw.proxy, "GET", "/influx", &[]).await;
    let lines = datagrams(&tagged, 1);
    assert_eq!(
        lines,
        [format!(
            "kong.request.count,service=my.api,route=influx,workspace=default,node={node},status=200:1|c"
        )]
    );

    let r = gw_admin_refusal().await;
    assert!(r.contains("sample_rate"), "{r}");
}

/// An Admin API refusal of a counter without a sample rate (Kong's conditional check).
async fn gw_admin_refusal() -> String {
    let gw = Gateway::sqlite().start();
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(serde_json::json!({"name": "statsd", "config": {"metrics": [{"name": "request_count", "stat_type": "counter"}]}})),
        )
        .await;
    assert_eq!(r.status, 400);
    r.json()["fields"].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syslog_gets_entries_by_severity() {
    let up = Upstream::start("syslog");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: r
    paths: [/s]
    plugins:
    - name: syslog
      config: {{client_errors_severity: debug, server_errors_severity: crit, syslog_facility: LOCAL0}}
"#,
        url = up.url()
    ))
    .env("TURNPIKE_SYSLOG_SOCKET", path.to_str().unwrap())
    .start();
    let mut buf = vec![0u8; 65536];
    // 200: info (LOCAL0 = 16: <134>); 404: debug, above log_level info, not sent; 500: crit.
    call(gw.proxy, "GET", "/s/ok", &[]).await;
    let n = sock.recv(&mut buf).unwrap();
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.starts_with("<134>"), "{msg}");
    let (head, json) = msg.split_once(": ").unwrap();
    assert!(head.contains(" kong["), "{head}");
    let e: Value = serde_json::from_str(json).unwrap();
    assert_eq!(e["request"]["uri"], "/s/ok");
    call(gw.proxy, "GET", "/s/status/404", &[]).await;
    call(gw.proxy, "GET", "/s/status/500", &[]).await;
    let n = sock.recv(&mut buf).unwrap();
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(
        msg.starts_with("<130>"),
        "the 500 (crit), the 404 left out: {msg}"
    );
    assert!(sock.recv(&mut buf).is_err(), "nothing else");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datadog_sends_tagged_metrics() {
    let up = Upstream::start("dd");
    let udp = udp_receiver();
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
consumers:
- username: alice
  custom_id: cust-1
  keyauth_credentials: [{{key: alice-key}}]
services:
- name: my.api
  url: {url}
  routes:
  - name: r
    paths: [/d]
    plugins:
    - name: key-auth
    - name: datadog
      config: {{host: 127.0.0.1, port: {udp}}}
"#,
        url = up.url(),
        udp = udp.local_addr().unwrap().port(),
    ))
    .start();
    assert_eq!(
        call(gw.proxy, "GET", "/d", &[("apikey", "alice-key")])
            .await
            .status,
        200
    );
    let lines = datagrams(&udp, 6);
    assert!(
        lines.contains(
            &"kong.request.count:1|c|#name:my_api,status:200,consumer:cust-1,app:kong".to_string()
        ),
        "{lines:?}"
    );
    for stat in [
        "latency",
        "request.size",
        "response.size",
        "upstream_latency",
        "kong_latency",
    ] {
        let prefix = format!("kong.{stat}:");
        assert!(
            lines.iter().any(|l| l.starts_with(&prefix)
                && l.ends_with("|ms|#name:my_api,status:200,consumer:cust-1,app:kong")),
            "{stat}: {lines:?}"
        );
    }
}
