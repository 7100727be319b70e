//! Upstream host names resolved by the gateway against a real DNS server (dnsmasq, started by
//! the harness): A answers, SRV answers with their ports, an answer that changes is followed
//! after its TTL (pooled connections to the old address are left), a dead resolver leaves the
//! last answer in use, and a name that does not exist is Kong's 503.

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::dns::Dnsmasq;
use crate::common::*;

async fn upstream_name(gw: &Gateway, path: &str) -> (u16, String) {
    let r = call(gw.proxy, "GET", path, &[]).await;
    (
        r.status,
        r.header("x-upstream").unwrap_or_default().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_follow_the_dns_and_survive_its_outage() {
    let port = free_port();
    let first = Upstream::start_at("first", SocketAddr::from(([127, 0, 0, 1], port)));
    let second = Upstream::start_at("second", SocketAddr::from(([127, 0, 0, 2], port)));
    let by_srv = Upstream::start("by-srv");
    let mut dns = Dnsmasq::start(
        "127.0.0.1 api.test\n127.0.0.1 srv-target.test\n",
        &[&format!(
            "_http._tcp.srv.test,srv-target.test,{},0,10",
            by_srv.addr.port()
        )],
    );
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: by-name
  url: http://api.test:{port}
  routes: [{{paths: [/name]}}]
- name: by-srv
  # The SRV record's port replaces this one.
  url: http://_http._tcp.srv.test:1
  routes: [{{paths: [/srv]}}]
- name: balanced
  host: named-upstream
  routes: [{{paths: [/balanced]}}]
- name: missing
  url: http://nowhere.test
  routes: [{{paths: [/missing]}}]
upstreams:
- name: named-upstream
  targets: [{{target: "api.test:{port}"}}]
"#
    ))
    .env("TURNPIKE_DNS_RESOLVER", &format!("127.0.0.1:{}", dns.port))
    .env("TURNPIKE_DNS_STALE_TTL", "120")
    .start();

    assert_eq!(upstream_name(&gw, "/name").await, (200, "first".into()));
    assert_eq!(upstream_name(&gw, "/balanced").await, (200, "first".into()));
    assert_eq!(upstream_name(&gw, "/srv").await, (200, "by-srv".into()));
    let r = call(gw.proxy, "GET", "/missing", &[]).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["message"], "name resolution failed");

    // The answer changes: after its TTL (1 s) new requests go to the new address, although
    // kept-alive connections to the old one are still open in the pool.
    dns.set_hosts("127.0.0.2 api.test\n127.0.0.1 srv-target.test\n");
    assert!(
        eventually(Duration::from_secs(10), async || {
            upstream_name(&gw, "/name").await == (200, "second".into())
        })
        .await,
        "the new address was never used"
    );
    for path in ["/name", "/balanced"] {
        for _ in 0..5 {
            assert_eq!(upstream_name(&gw, path).await, (200, "second".into()));
        }
    }
    let first_connections = first.connections.load(std::sync::atomic::Ordering::SeqCst);

    // The resolver dies: past the TTL the last answers are still used (dns_stale_ttl), no
    // request fails.
    // Requests go on for at least 4 s (past the TTL) and until the gateway has seen a refresh
    // fail (the resolver's timeouts take a few seconds).
    dns.kill();
    let started = std::time::Instant::now();
    loop {
        assert_eq!(upstream_name(&gw, "/name").await, (200, "second".into()));
        assert_eq!(upstream_name(&gw, "/srv").await, (200, "by-srv".into()));
        let seen = gw.log_text().contains("using its last answer");
        if seen && started.elapsed() > Duration::from_secs(4) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no failed refresh logged: {}",
            gw.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        first.connections.load(std::sync::atomic::Ordering::SeqCst),
        first_connections,
        "no connection to the old address after the change"
    );
    drop(second);
}
