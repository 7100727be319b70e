//! tcp-log and udp-log on the real binary: each request's entry, Kong's serialized JSON,
//! arrives at receivers the test listens with (a TCP listener reading lines, a UDP socket
//! reading datagrams); a receiver that is down costs the request nothing.

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

    // A receiver that refuses connections: requests are served all the same.
    for _ in 0..3 {
        assert_eq!(call(gw.proxy, "GET", "/nowhere", &[]).await.status, 200);
    }
    drop(dead);
    assert!(
        gw.log_text().contains("tcp-log: cannot connect"),
        "the failure is logged once"
    );
}
