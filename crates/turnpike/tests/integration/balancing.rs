//! Upstreams' balancing algorithms on the real binary with several real upstream servers:
//! consistent hashing (stability when a target is added, cookies), least-connections and
//! latency steering away from a slow target.

use std::collections::HashMap;
use std::time::Duration;

use crate::common::*;
use serde_json::json;

async fn upstream_of(addr: std::net::SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    call(addr, "GET", path, headers).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_hashing_is_stable_and_sticky() {
    let ups: Vec<Upstream> = (0..4).map(|i| Upstream::start(&format!("t{i}"))).collect();
    let gw = Gateway::sqlite().start();
    for (path, body) in [
        (
            "/upstreams",
            json!({"name": "ring", "algorithm": "consistent-hashing", "hash_on": "header", "hash_on_header": "x-user", "hash_fallback": "cookie", "hash_on_cookie": "sticky"}),
        ),
        (
            "/services",
            json!({"name": "s", "host": "ring", "port": 80}),
        ),
        ("/services/s/routes", json!({"name": "r", "paths": ["/h"]})),
    ] {
        let r = gw.admin("POST", path, Some(body)).await;
        assert_eq!(r.status, 201, "{path}: {}", r.json());
    }
    for u in &ups[..3] {
        let r = gw
            .admin(
                "POST",
                "/upstreams/ring/targets",
                Some(json!({"target": u.addr.to_string()})),
            )
            .await;
        assert_eq!(r.status, 201);
    }
    let p = gw.proxy;
    // Until the node runs all three targets.
    assert!(
        eventually(Duration::from_secs(10), async || {
            let mut seen = std::collections::HashSet::new();
            for k in 0..60 {
                let r = upstream_of(p, "/h", &[("x-user", &format!("user-{k}"))]).await;
                if let Some(n) = r.header("x-upstream") {
                    seen.insert(n.to_string());
                }
            }
            seen.len() == 3
        })
        .await
    );
    let mut before = HashMap::new();
    for k in 0..120 {
        let user = format!("user-{k}");
        let r = upstream_of(p, "/h", &[("x-user", &user)]).await;
        let name = r.header("x-upstream").unwrap().to_string();
        // The same key always lands on the same target.
        let again = upstream_of(p, "/h", &[("x-user", &user)]).await;
        assert_eq!(again.header("x-upstream"), Some(name.as_str()));
        before.insert(user, name);
    }
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for n in before.values() {
        *counts.entry(n.as_str()).or_default() += 1;
    }
    assert_eq!(counts.len(), 3, "{counts:?}");

    // A fourth target: only about a quarter of the keys move, and only to it.
    let r = gw
        .admin(
            "POST",
            "/upstreams/ring/targets",
            Some(json!({"target": ups[3].addr.to_string()})),
        )
        .await;
    assert_eq!(r.status, 201);
    assert!(
        eventually(Duration::from_secs(10), async || {
            let mut seen = false;
            for k in 0..40 {
                let r = upstream_of(p, "/h", &[("x-user", &format!("user-{k}"))]).await;
                seen |= r.header("x-upstream") == Some("t3");
            }
            seen
        })
        .await
    );
    let mut moved = 0;
    for (user, old) in &before {
        let r = upstream_of(p, "/h", &[("x-user", user)]).await;
        let now = r.header("x-upstream").unwrap();
        if now != old {
            assert_eq!(now, "t3", "{user} moved from {old} to {now}");
            moved += 1;
        }
    }
    assert!((10..=55).contains(&moved), "{moved} of 120 keys moved");

    // No header: the fallback cookie, set by the gateway, then sticky.
    let r = upstream_of(p, "/h", &[]).await;
    let cookie = r
        .header("set-cookie")
        .unwrap_or_else(|| panic!("no cookie: {:?}", r.headers))
        .to_string();
    assert!(
        cookie.starts_with("sticky=") && cookie.contains("Path=/"),
        "{cookie}"
    );
    let target = r.header("x-upstream").unwrap().to_string();
    let pair = cookie.split(';').next().unwrap().to_string();
    for _ in 0..5 {
        let r = upstream_of(p, "/h", &[("cookie", &pair)]).await;
        assert_eq!(r.header("x-upstream"), Some(target.as_str()));
        assert!(r.header("set-cookie").is_none());
    }
}

/// Two targets, one answering after 150 ms: least-connections and latency send most of the
/// traffic to the fast one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_connections_and_latency_avoid_a_slow_target() {
    let fast = Upstream::start("fast");
    let slow = Upstream::start_with_delay("slow", Duration::from_millis(150));
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
upstreams:
- name: lc
  algorithm: least-connections
  targets: [{{target: "{fast}"}}, {{target: "{slow}"}}]
- name: lat
  algorithm: latency
  targets: [{{target: "{fast}"}}, {{target: "{slow}"}}]
services:
- name: lc
  host: lc
  routes: [{{name: lc, paths: [/lc]}}]
- name: lat
  host: lat
  routes: [{{name: lat, paths: [/lat]}}]
"#,
        fast = fast.addr,
        slow = slow.addr
    ))
    .start();
    let p = gw.proxy;
    for path in ["/lc", "/lat"] {
        // Ten clients, each sending requests one after another for a while.
        let mut tasks = Vec::new();
        for _ in 0..10 {
            tasks.push(tokio::spawn(async move {
                let mut fast_hits = 0;
                let mut total = 0;
                for _ in 0..15 {
                    let r = upstream_of(p, path, &[]).await;
                    assert_eq!(r.status, 200);
                    total += 1;
                    if r.header("x-upstream") == Some("fast") {
                        fast_hits += 1;
                    }
                }
                (fast_hits, total)
            }));
        }
        let (mut f, mut t) = (0, 0);
        for task in tasks {
            let (a, b) = task.await.unwrap();
            f += a;
            t += b;
        }
        // Round-robin would give the fast target half; these give it most.
        assert!(f * 10 >= t * 7, "{path}: {f} of {t} to the fast target");
    }
}
