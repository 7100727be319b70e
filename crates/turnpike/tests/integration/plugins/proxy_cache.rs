//! proxy-cache on the real binary: Kong's cache key, Miss then Hit with `Age`, Bypass for what
//! cannot be cached, Refresh past `cache_ttl`, Cache-Control with `cache_control`, the
//! `/proxy-cache` Admin API, one upstream fetch for concurrent misses, clients that are not
//! `wrk` (HTTP/1.0, HEAD), and bad configs refused in Kong's shape.

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use crate::common::*;
use serde_json::json;
use sha2::{Digest, Sha256};

fn sha(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_are_cached_as_kong_caches_them() {
    let up = Upstream::start("pc");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: cached
    paths: [/c]
    plugins:
    - name: proxy-cache
      config: {{strategy: memory, content_type: [application/json]}}
  - name: varied
    paths: [/v]
    plugins:
    - name: proxy-cache
      config: {{strategy: memory, content_type: [application/json], vary_query_params: [a], vary_headers: [X-Tenant], ignore_uri_case: true}}
  - name: short
    paths: [/short]
    plugins:
    - name: proxy-cache
      config: {{strategy: memory, content_type: [application/json], cache_ttl: 1, storage_ttl: 30}}
  - name: text-only
    paths: [/text]
    plugins:
    - name: proxy-cache
      config: {{strategy: memory, content_type: ["text/plain", "text/*; charset=utf-8"]}}
  - name: quiet
    paths: [/quiet]
    plugins:
    - name: proxy-cache
      config:
        strategy: memory
        content_type: [application/json]
        response_headers: {{age: false, X-Cache-Status: false, X-Cache-Key: false}}
  - name: controlled
    paths: [/cc]
    plugins:
    - name: proxy-cache
      config: {{strategy: memory, content_type: [application/json], cache_control: true}}
  - name: slow
    paths: [/slow]
    plugins:
    - name: proxy-cache
      config: {{strategy: memory, content_type: [application/json]}}
"#,
        url = up.url()
    ))
    .start();
    let route_id = |name: &'static str| {
        let admin = gw.admin;
        async move {
            admin_call(admin, "GET", &format!("/routes/{name}"), None)
                .await
                .json()["id"]
                .as_str()
                .unwrap()
                .to_string()
        }
    };
    let upstream_requests = || up.requests.load(SeqCst);

    // Miss, then Hit: the same status, body and upstream headers, with Age; the key is Kong's
    // (the route's id, the method, nginx's request line cut at `?`, no vary parts).
    let cached = route_id("cached").await;
    let before = upstream_requests();
    let miss = call(gw.proxy, "GET", "/c/sized", &[]).await;
    assert_eq!(miss.status, 200);
    assert_eq!(miss.header("x-cache-status"), Some("Miss"));
    let key = sha(&format!("{cached}|GET|GET /c/sized HTTP/1.1||"));
    assert_eq!(miss.header("x-cache-key"), Some(key.as_str()));
    let hit = call(gw.proxy, "GET", "/c/sized", &[]).await;
    assert_eq!(hit.status, 200);
    assert_eq!(hit.header("x-cache-status"), Some("Hit"));
    assert_eq!(hit.header("x-cache-key"), Some(key.as_str()));
    assert!(hit.header("age").is_some(), "{:?}", hit.headers);
    assert_eq!(hit.body, miss.body);
    assert_eq!(hit.header("x-upstream"), Some("pc"));
    assert_eq!(hit.header("content-type"), Some("application/json"));
    assert_eq!(
        hit.header("content-length")
            .map(|l| l.parse::<usize>().unwrap()),
        Some(hit.body.len())
    );
    assert!(
        hit.header("x-kong-upstream-latency").is_none(),
        "{:?}",
        hit.headers
    );
    assert_eq!(
        upstream_requests(),
        before + 1,
        "the hit never reached the upstream"
    );
    // A streamed (chunked) response is cached whole.
    call(gw.proxy, "GET", "/c/chunked", &[]).await;
    let hit = call(gw.proxy, "GET", "/c/chunked", &[]).await;
    assert_eq!(hit.header("x-cache-status"), Some("Hit"));
    assert_eq!(hit.json()["uri"], "/chunked");

    // Query arguments are part of the key, sorted by name.
    let q = call(gw.proxy, "GET", "/c/sized?b=2&a=1", &[]).await;
    assert_eq!(q.header("x-cache-status"), Some("Miss"));
    assert_eq!(
        q.header("x-cache-key"),
        Some(sha(&format!("{cached}|GET|GET /c/sized|a=1:b=2|")).as_str())
    );
    let q = call(gw.proxy, "GET", "/c/sized?a=1&b=2", &[]).await;
    assert_eq!(
        q.header("x-cache-status"),
        Some("Hit"),
        "same arguments, other order"
    );

    // vary_query_params and vary_headers pick what counts; ignore_uri_case lowercases.
    let varied = route_id("varied").await;
    let r = call(gw.proxy, "GET", "/v/X?a=1&junk=2", &[("x-tenant", "t1")]).await;
    assert_eq!(
        r.header("x-cache-key"),
        Some(sha(&format!("{varied}|GET|get /v/x|a=1|X-Tenant=t1")).as_str())
    );
    let r = call(gw.proxy, "GET", "/v/x?a=1&junk=3", &[("x-tenant", "t1")]).await;
    assert_eq!(r.header("x-cache-status"), Some("Hit"));
    let r = call(gw.proxy, "GET", "/v/x?a=1", &[("x-tenant", "t2")]).await;
    assert_eq!(r.header("x-cache-status"), Some("Miss"), "another tenant");

    // Bypass: a method not cached, a status not cached, a content type not cached.
    let r = call(gw.proxy, "POST", "/c/sized", &[]).await;
    assert_eq!(r.header("x-cache-status"), Some("Bypass"));
    assert!(r.header("x-cache-key").is_none());
    for _ in 0..2 {
        let r = call(gw.proxy, "GET", "/c/status/500", &[]).await;
        assert_eq!(r.status, 500);
        assert_eq!(r.header("x-cache-status"), Some("Bypass"));
    }
    let r = call(gw.proxy, "GET", "/text/sized", &[]).await;
    assert_eq!(
        r.header("x-cache-status"),
        Some("Bypass"),
        "json is not text/plain"
    );

    // Past cache_ttl (kept longer by storage_ttl) the entry is refreshed from the upstream.
    call(gw.proxy, "GET", "/short/x", &[]).await;
    assert_eq!(
        call(gw.proxy, "GET", "/short/x", &[])
            .await
            .header("x-cache-status"),
        Some("Hit")
    );
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(
        call(gw.proxy, "GET", "/short/x", &[])
            .await
            .header("x-cache-status"),
        Some("Refresh")
    );

    // response_headers off: no diagnostic headers, unless the client sends Kong-Debug.
    call(gw.proxy, "GET", "/quiet/x", &[]).await;
    let r = call(gw.proxy, "GET", "/quiet/x", &[]).await;
    assert!(r.header("x-cache-status").is_none(), "{:?}", r.headers);
    assert!(r.header("age").is_none());
    let r = call(gw.proxy, "GET", "/quiet/x", &[("kong-debug", "1")]).await;
    assert_eq!(r.header("x-cache-status"), Some("Hit"));
    assert!(r.header("x-cache-key").is_some());

    // cache_control: the client's no-cache bypasses; only-if-cached on a miss is a 504; an
    // upstream response without a max-age or Expires is not stored.
    let r = call(gw.proxy, "GET", "/cc/x", &[("cache-control", "no-cache")]).await;
    assert_eq!(r.header("x-cache-status"), Some("Bypass"));
    let r = call(
        gw.proxy,
        "GET",
        "/cc/x",
        &[("cache-control", "only-if-cached")],
    )
    .await;
    assert_eq!(r.status, 504);
    let r = call(gw.proxy, "GET", "/cc/x", &[]).await;
    assert_eq!(
        (r.status, r.header("x-cache-status")),
        (200, Some("Bypass"))
    );

    // HTTP/1.0 and HEAD are requests of their own (nginx's request line is in the key).
    let raw = |req: &'static str| {
        let addr = gw.proxy;
        async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = Vec::new();
            s.read_to_end(&mut out).await.unwrap();
            String::from_utf8_lossy(&out).to_string()
        }
    };
    let first = raw("GET /c/old HTTP/1.0\r\n\r\n").await;
    assert!(first.contains("x-cache-status: Miss"), "{first}");
    assert!(
        first.contains(&sha(&format!("{cached}|GET|GET /c/old HTTP/1.0||"))),
        "{first}"
    );
    let second = raw("GET /c/old HTTP/1.0\r\n\r\n").await;
    assert!(
        second.starts_with("HTTP/1.0 200") || second.starts_with("HTTP/1.1 200"),
        "{second}"
    );
    assert!(second.contains("x-cache-status: Hit"), "{second}");
    let body = |t: &str| t.split_once("\r\n\r\n").unwrap().1.to_string();
    assert_eq!(body(&first), body(&second));
    let head = call(gw.proxy, "HEAD", "/c/sized", &[]).await;
    assert_eq!(head.header("x-cache-status"), Some("Miss"));
    assert!(head.body.is_empty());
    let head = call(gw.proxy, "HEAD", "/c/sized", &[]).await;
    assert_eq!(head.header("x-cache-status"), Some("Hit"));
    assert!(head.body.is_empty());

    // Concurrent misses of one key: one upstream request, every client answered.
    let before = upstream_requests();
    let tasks: Vec<_> = (0..12)
        .map(|_| {
            let addr = gw.proxy;
            tokio::spawn(async move { call(addr, "GET", "/slow/delay/400", &[]).await })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        let r = t.await.unwrap();
        statuses.push((r.status, r.header("x-cache-status").map(String::from)));
    }
    assert!(statuses.iter().all(|(s, _)| *s == 200), "{statuses:?}");
    assert_eq!(
        statuses
            .iter()
            .filter(|(_, c)| c.as_deref() == Some("Miss"))
            .count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(upstream_requests(), before + 1, "{statuses:?}");

    // The Admin API: read an entry, purge it, purge everything.
    let r = gw.admin("GET", &format!("/proxy-cache/{key}"), None).await;
    assert_eq!(r.status, 200);
    let entry = r.json();
    assert_eq!(entry["status"], 200);
    assert_eq!(entry["version"], 1);
    assert_eq!(entry["headers"]["x-upstream"], "pc");
    assert_eq!(entry["body_len"], miss.body.len());
    let plugin_id = gw.admin("GET", "/routes/cached/plugins", None).await.json()["data"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = gw
        .admin(
            "GET",
            &format!("/proxy-cache/{plugin_id}/caches/{key}"),
            None,
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["body"], entry["body"]);
    let r = gw
        .admin("DELETE", &format!("/proxy-cache/{key}"), None)
        .await;
    assert_eq!(r.status, 204);
    assert_eq!(
        gw.admin("GET", &format!("/proxy-cache/{key}"), None)
            .await
            .status,
        404
    );
    let r = call(gw.proxy, "GET", "/c/sized", &[]).await;
    assert_eq!(r.header("x-cache-status"), Some("Miss"), "purged");
    assert_eq!(gw.admin("DELETE", "/proxy-cache", None).await.status, 204);
    let r = call(gw.proxy, "GET", "/c/sized", &[]).await;
    assert_eq!(r.header("x-cache-status"), Some("Miss"), "flushed");
    assert_eq!(
        gw.admin("GET", "/proxy-cache/0000/caches/nope", None)
            .await
            .status,
        404
    );
    assert_eq!(gw.admin("POST", "/proxy-cache", None).await.status, 405);
    let endpoints = gw.admin("GET", "/endpoints", None).await.json();
    assert!(
        endpoints["data"]
            .as_array()
            .unwrap()
            .contains(&json!("/proxy-cache/{plugin_id}/caches/{cache_key}")),
        "{endpoints}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_cache_configs_are_checked_as_kong_checks_them() {
    let gw = Gateway::sqlite()
        .env("KONG_NGINX_HTTP_LUA_SHARED_DICT", "my_cache 1m")
        .start();
    let post = |config| post_plugin(gw.admin, "proxy-cache", config);
    let r = post(json!({})).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["fields"]["config"]["strategy"],
        "required field missing"
    );
    let r = post(json!({"strategy": "redis"})).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["fields"]["config"]["strategy"],
        "expected one of: memory"
    );
    let r = post(json!({"strategy": "memory", "memory": {"dictionary_name": "nope"}})).await;
    assert_eq!(r.status, 400, "{:?}", r.json());
    assert_eq!(
        r.json()["fields"]["@entity"],
        json!(["missing shared dict 'nope'"]),
        "{:?}",
        r.json()
    );
    let r = post(json!({"strategy": "memory", "response_code": []})).await;
    assert_eq!(r.status, 400);
    let r = post(json!({"strategy": "memory", "cache_ttl": 0})).await;
    assert_eq!(r.status, 400);
    // The operator's own dictionary (nginx_http_lua_shared_dict), and Kong's defaults filled.
    let r = post(json!({"strategy": "memory", "memory": {"dictionary_name": "my_cache"}})).await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let c = &r.json()["config"];
    assert_eq!(c["response_code"], json!([200, 301, 404]));
    assert_eq!(c["request_method"], json!(["GET", "HEAD"]));
    assert_eq!(c["content_type"], json!(["text/plain", "application/json"]));
    assert_eq!(c["cache_ttl"], 300);
    assert_eq!(
        c["response_headers"],
        json!({"age": true, "X-Cache-Status": true, "X-Cache-Key": true})
    );
    let id = r.json()["id"].as_str().unwrap().to_string();
    assert_eq!(
        gw.admin("DELETE", &format!("/plugins/{id}"), None)
            .await
            .status,
        204
    );
    let r = post(json!({"strategy": "memory"})).await;
    assert_eq!(
        r.status,
        201,
        "kong_db_cache is there by default: {:?}",
        r.json()
    );
}
