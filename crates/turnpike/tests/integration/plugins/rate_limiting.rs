//! rate-limiting (local and cluster policies; the redis policy: `rate_limiting_redis.rs`) on the real binary.

use crate::common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limiting_counts_per_consumer_and_exactly() {
    let up = Upstream::start("rl");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
consumers:
- username: a
  keyauth_credentials: [{{key: ka}}]
- username: b
  keyauth_credentials: [{{key: kb}}]
services:
- name: svc
  url: {url}
  routes:
  - name: per-consumer
    paths: [/c]
    plugins:
    - name: key-auth
    - name: rate-limiting
      config: {{year: 3}}
  - name: burst
    paths: [/burst]
    plugins:
    - name: rate-limiting
      config: {{year: 100, limit_by: ip, error_code: 403, error_message: "enough"}}
  - name: quiet
    paths: [/quiet]
    plugins:
    - name: rate-limiting
      config: {{year: 1000, hide_client_headers: true}}
"#,
        url = up.url()
    ))
    .start();
    let p = gw.proxy;
    for left in [2, 1, 0] {
        let r = call(p, "GET", "/c", &[("apikey", "ka")]).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-ratelimit-limit-year"), Some("3"));
        assert_eq!(
            r.header("x-ratelimit-remaining-year"),
            Some(left.to_string().as_str())
        );
        assert_eq!(
            r.header("ratelimit-remaining"),
            Some(left.to_string().as_str())
        );
    }
    let r = call(p, "GET", "/c", &[("apikey", "ka")]).await;
    assert_eq!(
        (r.status, r.json()),
        (429, json!({"message": "API rate limit exceeded"}))
    );
    assert!(r.header("retry-after").unwrap().parse::<u64>().unwrap() > 0);
    // Another consumer has its own count.
    assert_eq!(call(p, "GET", "/c", &[("apikey", "kb")]).await.status, 200);
    assert!(call(p, "GET", "/quiet", &[])
        .await
        .header("x-ratelimit-limit-year")
        .is_none());

    // 200 concurrent requests against a limit of 100 (both workers): exactly 100 pass.
    let counts = concurrent_statuses(&[p], "/burst", 200).await;
    assert_eq!(counts, [(200, 100), (403, 100)].into());
}

#[tokio::test]
async fn rate_limiting_configs_are_checked() {
    let gw = Gateway::sqlite().start();
    for (config, field) in [
        (json!({}), "@entity"),
        (json!({"minute": 10, "second": 20}), "@entity"),
        (json!({"minute": 10, "limit_by": "header"}), "header_name"),
        (json!({"minute": -1}), "minute"),
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
        // Field errors are strings; checks of the whole record a list, as in Kong.
        let found = &body["fields"]["config"][field];
        if field == "@entity" {
            assert!(found[0].is_string(), "{config}: {body}");
        } else {
            assert!(found.is_string(), "{config}: {body}");
        }
    }
}

/// rate-limiting's cluster policy on the embedded store: exact under concurrency; refused on a
/// DB-less node, as Kong refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_policy_counts_in_the_database() {
    let up = Upstream::start("rl-cluster");
    let gw = Gateway::sqlite().start();
    gw.add_service_route(&up.url(), "/c").await;
    let r = gw
        .admin(
            "POST",
            "/services/s/plugins",
            Some(json!({"name": "rate-limiting", "config": {"year": 100, "hour": 100, "policy": "cluster", "limit_by": "ip"}})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.json());
    let p = gw.proxy;
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            call(p, "GET", "/c", &[])
                .await
                .header("x-ratelimit-limit-year")
                .is_some()
        })
        .await
    );
    let r = call(p, "GET", "/c", &[]).await;
    assert_eq!(r.header("x-ratelimit-remaining-year"), Some("98"));
    assert_eq!(r.header("x-ratelimit-remaining-hour"), Some("98"));
    let counts = concurrent_statuses(&[p], "/c", 200).await;
    assert_eq!(counts, [(200, 98), (429, 102)].into(), "{}", gw.log_text());

    // DB-less: refused with a clear message.
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "k.yml",
        "_format_version: '3.0'\nplugins:\n- name: rate-limiting\n  config: {minute: 5, policy: cluster}\n",
    );
    let (ok, out) = run(&["config", "parse", f.to_str().unwrap()], &[]);
    assert!(!ok);
    assert!(out.contains("policy 'cluster' needs a database"), "{out}");
}
