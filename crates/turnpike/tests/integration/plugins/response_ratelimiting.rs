//! response-ratelimiting on the real binary: the upstream spends named limits with
//! `X-Kong-Limit`; the client sees Kong's headers, the upstream what remains; a response that
//! spends a used-up limit becomes a 429 without body; block_on_first_violation refuses before
//! the upstream; bad configs are refused in Kong's shape.

use std::time::Duration;

use crate::common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_spend_named_limits() {
    let up = Upstream::start("rrl");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: spend
    paths: [/rr]
    plugins:
    - name: response-ratelimiting
      config: {{limit_by: ip, limits: {{videos: {{minute: 2}}, images: {{minute: 10, hour: 20}}}}}}
  - name: block
    paths: [/block]
    plugins:
    - name: response-ratelimiting
      config: {{limit_by: ip, block_on_first_violation: true, limits: {{videos: {{hour: 1}}}}}}
"#,
        url = up.url()
    ))
    .start();
    let p = gw.proxy;
    // The log phase adds what a response spent once it went out: wait for it.
    let remaining_is = async |path: &str, want: &str| {
        eventually(Duration::from_secs(5), async || {
            call(p, "GET", path, &[])
                .await
                .header("x-ratelimit-remaining-videos-minute")
                == Some(want)
        })
        .await
    };

    let r = call(p, "GET", "/rr/limit/videos=1,%20images=3", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ratelimit-limit-videos-minute"), Some("2"));
    assert_eq!(r.header("x-ratelimit-remaining-videos-minute"), Some("1"));
    assert_eq!(r.header("x-ratelimit-remaining-images-minute"), Some("7"));
    assert_eq!(r.header("x-ratelimit-limit-images-hour"), Some("20"));
    assert!(
        r.header("x-kong-limit").is_none(),
        "the upstream's header is removed"
    );
    assert_eq!(
        r.json()["headers"]["x-ratelimit-remaining-videos"],
        "2",
        "to the upstream"
    );
    assert!(remaining_is("/rr/plain", "1").await);

    let r = call(p, "GET", "/rr/limit/videos=1", &[]).await;
    assert_eq!(r.header("x-ratelimit-remaining-videos-minute"), Some("0"));
    assert!(remaining_is("/rr/plain", "0").await);
    // Spending a used-up limit: 429, no body; spending nothing still goes through.
    let r = call(p, "GET", "/rr/limit/videos=1", &[]).await;
    assert_eq!(r.status, 429);
    assert!(r.body.is_empty(), "{:?}", r.body);
    let r = call(p, "GET", "/rr/limit/images=1", &[]).await;
    assert_eq!(r.status, 200);

    // block_on_first_violation: refused before the upstream once a limit is spent.
    assert_eq!(
        call(p, "GET", "/block/limit/videos=1", &[]).await.status,
        200
    );
    assert!(
        eventually(Duration::from_secs(5), async || {
            call(p, "GET", "/block/x", &[]).await.status == 429
        })
        .await
    );
    let r = call(p, "GET", "/block/x", &[]).await;
    assert_eq!(
        r.json(),
        json!({"message": "API rate limit exceeded for 'videos'"})
    );
}

#[tokio::test]
async fn bad_configs_are_refused() {
    let gw = Gateway::sqlite().start();
    for (config, field) in [
        (json!({}), "limits"),
        (json!({"limits": {}}), "limits"),
        (json!({"limits": {"v": {}}}), "limits"),
        (
            json!({"limits": {"v": {"minute": 10, "hour": 5}}}),
            "limits",
        ),
        (json!({"limits": {"v": {"minute": "x"}}}), "limits"),
    ] {
        let r = gw
            .admin(
                "POST",
                "/plugins",
                Some(json!({"name": "response-ratelimiting", "config": config})),
            )
            .await;
        assert_eq!(r.status, 400, "{config}: {:?}", r.json());
        assert!(
            !r.json()["fields"]["config"][field].is_null(),
            "{config}: {:?}",
            r.json()
        );
    }
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(json!({"name": "response-ratelimiting", "config": {"limits": {"v": {"minute": 1}}}})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    assert_eq!(r.json()["config"]["header_name"], "x-kong-limit");
    let id = r.json()["id"].as_str().unwrap().to_string();
    assert_eq!(
        gw.admin("DELETE", &format!("/plugins/{id}"), None)
            .await
            .status,
        204
    );
    // `cluster` counts in the database: taken on a database node, refused DB-less.
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(json!({"name": "response-ratelimiting", "config": {"limits": {"v": {"minute": 1}}, "policy": "cluster"}})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "kong.yml",
        "_format_version: '3.0'\nplugins:\n- name: response-ratelimiting\n  config: {policy: cluster, limits: {v: {minute: 1}}}\n",
    );
    let (ok, out) = run(&["config", "parse", file.to_str().unwrap()], &[]);
    assert!(!ok, "{out}");
    assert!(out.contains("policy 'cluster' needs a database"), "{out}");
}

/// The cluster policy on the embedded store: usage read from and added to the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_policy_counts_in_the_database() {
    let up = Upstream::start("rrl-cluster");
    let gw = Gateway::sqlite().start();
    gw.add_service_route(&up.url(), "/rr").await;
    let r = gw
        .admin(
            "POST",
            "/routes/r/plugins",
            Some(json!({"name": "response-ratelimiting", "config": {"limit_by": "ip", "policy": "cluster", "limits": {"videos": {"minute": 3}}}})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let p = gw.proxy;
    assert!(
        eventually(Duration::from_secs(10), async || call(
            p,
            "GET",
            "/rr/x",
            &[]
        )
        .await
        .header("x-ratelimit-limit-videos-minute")
            == Some("3"))
        .await
    );
    let r = call(p, "GET", "/rr/limit/videos=2", &[]).await;
    assert_eq!(r.header("x-ratelimit-remaining-videos-minute"), Some("1"));
    assert!(
        eventually(Duration::from_secs(5), async || call(
            p,
            "GET",
            "/rr/plain",
            &[]
        )
        .await
        .header("x-ratelimit-remaining-videos-minute")
            == Some("1"))
        .await
    );
    let r = call(p, "GET", "/rr/limit/videos=1", &[]).await;
    assert_eq!(r.status, 200);
    // Once the database has it, spending more is refused (and not counted).
    assert!(
        eventually(Duration::from_secs(5), async || call(
            p,
            "GET",
            "/rr/plain",
            &[]
        )
        .await
        .header("x-ratelimit-remaining-videos-minute")
            == Some("0"))
        .await
    );
    assert_eq!(call(p, "GET", "/rr/limit/videos=1", &[]).await.status, 429);
    // In Kong's table, keyed by the limit's name and period.
    let db = gw.dir.path().join("prefix/turnpike.db");
    let out = std::process::Command::new("sqlite3")
        .arg(&db)
        .arg("SELECT period, value FROM response_ratelimiting_metrics")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "videos_minute|3"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_share_usage_through_redis() {
    let redis = crate::common::redis::Redis::start();
    let up = Upstream::start("rrl-redis");
    let config = format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: spend
    paths: [/rr]
    plugins:
    - name: response-ratelimiting
      config:
        limit_by: ip
        policy: redis
        redis_host: 127.0.0.1
        redis_port: {port}
        limits: {{videos: {{minute: 3}}}}
"#,
        url = up.url(),
        port = redis.port
    );
    let a = Gateway::with_config(&config).start();
    let b = Gateway::with_config(&config).start();
    let r = call(a.proxy, "GET", "/rr/limit/videos=2", &[]).await;
    assert_eq!(r.header("x-ratelimit-remaining-videos-minute"), Some("1"));
    // The other node reads what the first one added.
    assert!(
        eventually(Duration::from_secs(5), async || {
            call(b.proxy, "GET", "/rr/plain", &[])
                .await
                .header("x-ratelimit-remaining-videos-minute")
                == Some("1")
        })
        .await
    );
    let keys = redis
        .command(&["KEYS", "response-ratelimit:*"])
        .unwrap_or_default();
    assert!(keys.contains("videos_minute"), "{keys}");
}
