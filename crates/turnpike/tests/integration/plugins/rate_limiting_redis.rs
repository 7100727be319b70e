//! rate-limiting's `redis` policy on the real binary with a real Redis (started by the
//! harness): exact across nodes, Kong's keys, and traffic surviving a Redis that dies.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::redis::Redis;
use crate::common::*;
use serde_json::json;

fn config(up: &Upstream, redis: &Redis) -> String {
    format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: shared
    paths: [/shared]
    plugins:
    - name: rate-limiting
      config:
        minute: 100
        limit_by: ip
        policy: redis
        redis: {{host: 127.0.0.1, port: {port}, timeout: 500}}
  - name: strict
    paths: [/strict]
    plugins:
    - name: rate-limiting
      config:
        hour: 1000
        policy: redis
        fault_tolerant: false
        redis_host: 127.0.0.1
        redis_port: {port}
  - name: two
    paths: [/two]
    plugins:
    - name: rate-limiting
      config:
        hour: 2
        year: 100
        limit_by: ip
        policy: redis
        redis: {{host: 127.0.0.1, port: {port}}}
  - name: tolerant
    paths: [/tolerant]
    plugins:
    - name: rate-limiting
      config:
        hour: 100000
        policy: redis
        redis: {{host: 127.0.0.1, port: {port}, timeout: 500}}
"#,
        url = up.url(),
        port = redis.port
    )
}

/// Waits until at least `margin` is left in the current minute, so a test's requests fall in one
/// window.
async fn away_from_minute_end(margin: u64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let left = 60 - now % 60;
    if left < margin {
        tokio::time::sleep(Duration::from_secs(left + 1)).await;
    }
}

async fn get_status(addr: std::net::SocketAddr, path: &str) -> u16 {
    call(addr, "GET", path, &[]).await.status
}

/// Three nodes, one Redis, limit 100 per minute: 1000 concurrent requests spread over the
/// nodes let exactly 100 through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_share_an_exact_limit() {
    let up = Upstream::start("rl-redis");
    let redis = Redis::start();
    let yaml = config(&up, &redis);
    let nodes = [
        Gateway::with_config(&yaml).start(),
        Gateway::with_config(&yaml).start(),
        Gateway::with_config(&yaml).start(),
    ];
    away_from_minute_end(20).await;

    // Sequential requests on different nodes see one count.
    for (i, node) in nodes.iter().enumerate() {
        let r = get(node.proxy, "x", "/shared").await;
        assert_eq!(r.status, 200, "{}", node.log_text());
        assert_eq!(r.header("x-ratelimit-limit-minute"), Some("100"));
        let left = (99 - i).to_string();
        assert_eq!(
            r.header("x-ratelimit-remaining-minute"),
            Some(left.as_str())
        );
        assert_eq!(r.header("ratelimit-remaining"), Some(left.as_str()));
    }
    // Kong's key, so Kong and Turnpike nodes count together during a migration.
    let keys = redis.command(&["KEYS", "ratelimit:*:minute"]).unwrap();
    assert!(
        keys.contains(":127.0.0.1:") && keys.contains("000:minute"),
        "{keys}"
    );
    assert!(redis.command(&["FLUSHALL"]).unwrap().contains("OK"));

    // Several windows: the first one blocks, in Redis (a local fallback would let more by).
    for (i, node) in nodes.iter().enumerate() {
        let r = get(node.proxy, "x", "/two").await;
        if i < 2 {
            assert_eq!(r.status, 200);
            assert_eq!(
                r.header("x-ratelimit-remaining-year"),
                Some(if i == 0 { "99" } else { "98" })
            );
        } else {
            assert_eq!(r.status, 429, "{}", node.log_text());
            assert_eq!(r.header("x-ratelimit-remaining-hour"), Some("0"));
        }
    }
    assert_eq!(get(nodes[0].proxy, "x", "/two").await.status, 429);
    assert!(!nodes[0].log_text().contains("rate-limiting: redis at"));

    let addrs: Vec<_> = nodes.iter().map(|n| n.proxy).collect();
    let counts = concurrent_statuses(&addrs, "/shared", 1000).await;
    assert_eq!(counts, [(200, 100), (429, 900)].into());
    let r = get(nodes[1].proxy, "x", "/shared").await;
    assert_eq!(r.status, 429);
    assert_eq!(r.json(), json!({"message": "API rate limit exceeded"}));
    assert!(r.header("retry-after").is_some());
}

/// Redis killed under load: fault-tolerant configs keep answering (counting per node), strict
/// ones answer 500, and counting goes back to Redis once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_dying_stops_no_traffic() {
    let up = Upstream::start("rl-redis-down");
    let mut redis = Redis::start();
    let gw = Gateway::with_config(&config(&up, &redis)).start();
    assert_eq!(get_status(gw.proxy, "/tolerant").await, 200);
    assert_eq!(get_status(gw.proxy, "/strict").await, 200);

    // A bounded load loop on the fault-tolerant route while Redis dies and comes back.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (total, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut loops = Vec::new();
    for _ in 0..4 {
        let (stop, total, failed, addr) = (stop.clone(), total.clone(), failed.clone(), gw.proxy);
        loops.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let s = get_status(addr, "/tolerant").await;
                total.fetch_add(1, Ordering::Relaxed);
                if s != 200 {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.kill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let during = total.load(Ordering::Relaxed);
    // fault_tolerant = false: the store error is the client's 500, in Kong's words.
    let r = get(gw.proxy, "x", "/strict").await;
    assert_eq!(
        (r.status, r.json()),
        (500, json!({"message": "An unexpected error occurred"}))
    );
    redis.resume();
    // Back to Redis: its counter for the route appears again.
    assert!(
        eventually(Duration::from_secs(10), async || {
            get_status(gw.proxy, "/tolerant").await;
            redis
                .command(&["KEYS", "ratelimit:*:hour"])
                .is_some_and(|k| k.starts_with("*1"))
        })
        .await
    );
    stop.store(true, Ordering::Relaxed);
    for l in loops {
        l.await.unwrap();
    }
    assert!(total.load(Ordering::Relaxed) > during);
    assert_eq!(failed.load(Ordering::Relaxed), 0, "{}", gw.log_text());
    // Each worker retries a failed server at most once a second: within a few, all are back.
    assert!(
        eventually(Duration::from_secs(10), async || {
            get_status(gw.proxy, "/strict").await == 200
                && get_status(gw.proxy, "/strict").await == 200
                && get_status(gw.proxy, "/strict").await == 200
        })
        .await
    );
    let log = gw.log_text();
    assert!(log.contains("rate-limiting: redis at 127.0.0.1"), "{log}");
    assert!(log.contains("answers again"), "{log}");
}

#[tokio::test]
async fn redis_configs_are_checked() {
    let gw = Gateway::sqlite().start();
    for (config, field) in [
        (json!({"minute": 10, "policy": "redis"}), "redis"),
        (
            json!({"minute": 10, "policy": "redis", "redis": {"host": "h", "port": 70000}}),
            "redis",
        ),
        (json!({"minute": 10, "sync_rate": 1}), "sync_rate"),
    ] {
        let r = gw
            .admin(
                "POST",
                "/plugins",
                Some(json!({"name": "rate-limiting", "config": config})),
            )
            .await;
        assert_eq!(r.status, 400, "{config}");
        let body = r.json();
        assert!(
            !body["fields"]["config"][field].is_null(),
            "{config}: {body}"
        );
    }
    // The deprecated flat fields land in the record, defaults filled in.
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(json!({"name": "rate-limiting", "config": {"minute": 5, "policy": "redis", "redis_host": "cache", "redis_port": 6380}})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.json());
    assert_eq!(
        r.json()["config"]["redis"],
        json!({"host": "cache", "port": 6380, "timeout": 2000, "username": null, "password": null,
               "database": 0, "ssl": false, "ssl_verify": false, "server_name": null})
    );
}

/// sync_rate > 0: counted on each node and pushed to Redis periodically. Within the documented
/// bound (limit + (nodes - 1) × what was left at the last sync), no admitted request missing
/// from Redis's count, and once synced every node refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_counts_reach_redis_within_the_bound() {
    let up = Upstream::start("rl-batched");
    let redis = Redis::start();
    let yaml = format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: batched
    paths: [/batched]
    plugins:
    - name: rate-limiting
      config:
        year: 40
        limit_by: ip
        policy: redis
        sync_rate: 0.2
        redis: {{host: 127.0.0.1, port: {port}}}
"#,
        url = up.url(),
        port = redis.port
    );
    let nodes = [
        Gateway::with_config(&yaml).start(),
        Gateway::with_config(&yaml).start(),
    ];
    let addrs: Vec<_> = nodes.iter().map(|n| n.proxy).collect();
    let counts = concurrent_statuses(&addrs, "/batched", 200).await;
    assert!(counts.keys().all(|s| [200, 429].contains(s)), "{counts:?}");
    let ok = counts.get(&200).copied().unwrap_or(0) as u64;
    assert!((40..=80).contains(&ok), "{ok} admitted");
    // Every admitted request reaches Redis's count.
    let count = || {
        redis
            .command(&["KEYS", "ratelimit:*:year"])
            .and_then(|k| k.lines().nth(2).map(String::from))
            .and_then(|key| redis.command(&["GET", &key]))
            .and_then(|v| v.lines().nth(1).and_then(|n| n.parse::<u64>().ok()))
    };
    assert!(
        eventually(Duration::from_secs(10), async || count() == Some(ok)).await,
        "redis holds {:?}, {ok} admitted",
        count()
    );
    // Synced: both nodes know the window is full.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for addr in &addrs {
        for _ in 0..5 {
            assert_eq!(get_status(*addr, "/batched").await, 429);
        }
    }
    assert_eq!(count(), Some(ok));
}

/// TLS to Redis (`redis.ssl`): counted over TLS; with `ssl_verify` a certificate the system
/// does not trust is refused (a store error: 500 when not fault-tolerant).
#[tokio::test]
async fn redis_over_tls() {
    let up = Upstream::start("rl-redis-tls");
    let redis = Redis::start_tls();
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: tls
    paths: [/tls]
    plugins:
    - name: rate-limiting
      config:
        hour: 2
        limit_by: ip
        policy: redis
        fault_tolerant: false
        redis: {{host: localhost, port: {port}, ssl: true, ssl_verify: false}}
  - name: verified
    paths: [/verified]
    plugins:
    - name: rate-limiting
      config:
        hour: 2
        limit_by: ip
        policy: redis
        fault_tolerant: false
        redis: {{host: localhost, port: {port}, ssl: true, ssl_verify: true}}
"#,
        url = up.url(),
        port = redis.port
    ))
    .start();
    let statuses = [
        get_status(gw.proxy, "/tls").await,
        get_status(gw.proxy, "/tls").await,
        get_status(gw.proxy, "/tls").await,
    ];
    assert_eq!(statuses, [200, 200, 429], "{}", gw.log_text());
    assert_eq!(get_status(gw.proxy, "/verified").await, 500);
}
