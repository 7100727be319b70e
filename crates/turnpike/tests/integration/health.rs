//! Target health on the real binary with real upstream servers: passive checks take a dead
//! target out, active checks bring it back when it recovers, the Admin API shows and sets
//! health (DB-less too), and no healthy target left means Kong's 503.

use std::time::Duration;

use crate::common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_targets_leave_and_come_back() {
    let good = Upstream::start("good");
    let later_port = free_port();
    let later = format!("127.0.0.1:{later_port}");
    let manual_a = Upstream::start("manual-a");
    let manual_b = Upstream::start("manual-b");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
upstreams:
- name: hc
  healthchecks:
    passive: {{unhealthy: {{tcp_failures: 1}}}}
    active:
      http_path: /status/200
      timeout: 0.5
      healthy: {{interval: 0.2, successes: 1}}
      unhealthy: {{interval: 0.2, tcp_failures: 1}}
  targets: [{{target: "{good}"}}, {{target: "{later}"}}]
- name: manual
  targets: [{{target: "{ma}"}}, {{target: "{mb}"}}]
services:
- name: hc
  host: hc
  retries: 2
  routes: [{{name: hc, paths: [/hc]}}]
- name: manual
  host: manual
  routes: [{{name: manual, paths: [/manual]}}]
"#,
        good = good.addr,
        ma = manual_a.addr,
        mb = manual_b.addr,
    ))
    .start();
    let p = gw.proxy;
    // The dead target costs no failed request (retries) and is soon marked unhealthy.
    for _ in 0..20 {
        let r = get(p, "x", "/hc").await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-upstream"), Some("good"));
    }
    assert!(
        eventually(Duration::from_secs(10), async || gw
            .health_of("hc", &later)
            .await
            == "UNHEALTHY")
        .await,
        "{}",
        gw.log_text()
    );
    assert_eq!(gw.health_of("hc", &good.addr.to_string()).await, "HEALTHY");
    // It starts: active checks bring it back, and traffic reaches it.
    let _later = Upstream::start_on("later", later_port);
    assert!(
        eventually(Duration::from_secs(10), async || gw
            .health_of("hc", &later)
            .await
            == "HEALTHY")
        .await,
        "{}",
        gw.log_text()
    );
    assert!(
        eventually(Duration::from_secs(10), async || get(p, "x", "/hc")
            .await
            .header("x-upstream")
            == Some("later"))
        .await
    );
    assert!(gw.log_text().contains("is now healthy (active"));

    // By hand, DB-less included (Kong answers 500 there): no checks configured.
    let a = manual_a.addr.to_string();
    let b = manual_b.addr.to_string();
    assert_eq!(gw.health_of("manual", &a).await, "HEALTHCHECKS_OFF");
    let r = gw
        .admin(
            "POST",
            &format!("/upstreams/manual/targets/{a}/unhealthy"),
            None,
        )
        .await;
    assert_eq!(r.status, 204);
    for _ in 0..6 {
        assert_eq!(
            get(p, "x", "/manual").await.header("x-upstream"),
            Some("manual-b")
        );
    }
    let r = gw
        .admin(
            "POST",
            &format!("/upstreams/manual/targets/{b}/unhealthy"),
            None,
        )
        .await;
    assert_eq!(r.status, 204);
    let r = get(p, "x", "/manual").await;
    assert_eq!(r.status, 503);
    assert_eq!(
        r.json()["message"],
        "failure to get a peer from the ring-balancer"
    );
    for t in [&a, &b] {
        let r = gw
            .admin(
                "POST",
                &format!("/upstreams/manual/targets/{t}/healthy"),
                None,
            )
            .await;
        assert_eq!(r.status, 204);
    }
    assert_eq!(get(p, "x", "/manual").await.status, 200);
    // Unknown upstreams and targets: Kong's 404.
    let r = gw
        .admin("POST", "/upstreams/manual/targets/10.9.9.9:1/healthy", None)
        .await;
    assert_eq!((r.status, r.json()), (404, json!({"message": "Not found"})));
    assert_eq!(
        gw.admin("GET", "/upstreams/nope/health", None).await.status,
        404
    );
    let r = gw.admin("GET", "/upstreams/manual/targets/all", None).await;
    assert_eq!(r.json()["data"].as_array().unwrap().len(), 2);
}
