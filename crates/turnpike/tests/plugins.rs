//! The plugin pipeline on the real binary: Kong's scoping precedence, PRIORITY order, config
//! validation through declarative files and the Admin API, with request-termination as the
//! first bundled plugin.

mod common;

use common::*;
use serde_json::json;

#[tokio::test]
async fn scoped_configs_follow_kong_precedence() {
    let up = Upstream::start("plugins");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  plugins:
  - name: request-termination
    config: {{status_code: 403, message: "service says no"}}
  routes:
  - name: plain
    paths: [/plain]
  - name: special
    paths: [/special]
    plugins:
    - name: request-termination
      config: {{status_code: 418, body: "teapot", content_type: text/plain}}
  - name: off
    paths: [/off]
    plugins:
    - name: request-termination
      enabled: false
- name: open
  url: {url}
  routes:
  - name: open
    paths: [/open]
plugins:
- name: request-termination
  config: {{trigger: x-maintenance}}
"#,
        url = up.url()
    ))
    .start();
    // Service-level config on a route without its own.
    let r = get(gw.proxy, "x", "/plain").await;
    assert_eq!(r.status, 403);
    assert_eq!(r.json(), json!({"message": "service says no"}));
    assert!(r
        .header("server")
        .is_some_and(|s| s.starts_with("turnpike/")));
    assert!(r.header("x-kong-response-latency").is_some());
    // Route-level config beats the service's.
    let r = get(gw.proxy, "x", "/special").await;
    assert_eq!((r.status, &r.body[..]), (418, &b"teapot"[..]));
    assert_eq!(r.header("content-type"), Some("text/plain"));
    // A disabled route-level instance does not fall back to the service's: Kong picks the most
    // specific *enabled* config, so the service's applies.
    assert_eq!(get(gw.proxy, "x", "/off").await.status, 403);
    // The global instance only fires on its trigger.
    assert_eq!(get(gw.proxy, "x", "/open").await.status, 200);
    let r = send(
        gw.proxy,
        req("GET", "/open?x-maintenance=1")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json(), json!({"message": "Service unavailable"}));
}

#[tokio::test]
async fn plugins_through_the_admin_api() {
    let up = Upstream::start("plugins-admin");
    let gw = Gateway::sqlite().start();
    assert_eq!(
        gw.admin(
            "POST",
            "/services",
            Some(json!({"name": "s", "url": up.url()}))
        )
        .await
        .status,
        201
    );
    assert_eq!(
        gw.admin(
            "POST",
            "/services/s/routes",
            Some(json!({"name": "r", "paths": ["/p"]}))
        )
        .await
        .status,
        201
    );
    assert_eq!(until_status(gw.proxy, "/p", 200).await.status, 200);

    // Defaults are filled in and stored.
    let r = gw
        .admin(
            "POST",
            "/routes/r/plugins",
            Some(json!({"name": "request-termination"})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let p = r.json();
    assert_eq!(p["config"]["status_code"], 503);
    assert_eq!(p["config"]["echo"], false);
    assert_eq!(
        p["route"]["id"],
        gw.admin("GET", "/routes/r", None).await.json()["id"]
    );
    assert_eq!(until_status(gw.proxy, "/p", 503).await.status, 503);

    // PATCH the config; disable; delete.
    let pid = p["id"].as_str().unwrap().to_string();
    let r = gw
        .admin(
            "PATCH",
            &format!("/plugins/{pid}"),
            Some(json!({"config": {"status_code": 429, "message": "slow down"}})),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["config"]["echo"], false);
    let t = until_status(gw.proxy, "/p", 429).await;
    assert_eq!(t.json(), json!({"message": "slow down"}));
    assert_eq!(
        gw.admin(
            "PATCH",
            &format!("/plugins/{pid}"),
            Some(json!({"enabled": false}))
        )
        .await
        .status,
        200
    );
    assert_eq!(until_status(gw.proxy, "/p", 200).await.status, 200);
    assert_eq!(
        gw.admin("DELETE", &format!("/plugins/{pid}"), None)
            .await
            .status,
        204
    );

    // Kong's errors for bad plugin configs; nothing stored.
    let r = gw
        .admin("POST", "/plugins", Some(json!({"name": "request-termination", "config": {"status_code": 42, "colour": "red"}})))
        .await;
    assert_eq!(r.status, 400);
    let e = r.json();
    assert_eq!(
        e["fields"]["config"]["status_code"],
        "value should be between 100 and 599"
    );
    assert_eq!(e["fields"]["config"]["colour"], "unknown field");
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(json!({"name": "request-termination", "config": {"message": "a", "body": "b"}})),
        )
        .await;
    assert_eq!(r.status, 400);
    let r = gw
        .admin("POST", "/plugins", Some(json!({"name": "no-such-plugin"})))
        .await;
    assert_eq!(r.status, 400);
    assert!(r.json()["fields"]["name"]
        .as_str()
        .unwrap()
        .contains("not enabled"));
    // One instance of a plugin per scope (Kong's cache key).
    assert_eq!(
        gw.admin(
            "POST",
            "/plugins",
            Some(json!({"name": "request-termination", "config": {"trigger": "t"}}))
        )
        .await
        .status,
        201
    );
    assert_eq!(
        gw.admin(
            "POST",
            "/plugins",
            Some(json!({"name": "request-termination"}))
        )
        .await
        .status,
        409
    );
    assert_eq!(
        gw.admin("GET", "/plugins", None).await.json()["data"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // Schemas and the plugin lists.
    let s = gw
        .admin("GET", "/schemas/plugins/request-termination", None)
        .await;
    assert_eq!(s.status, 200);
    let schema = s.json();
    let status = &schema["fields"][4]["config"]["fields"][0]["status_code"];
    assert_eq!(status["default"], 503, "{schema}");
    assert_eq!(status["between"], json!([100, 599]), "{schema}");
    assert_eq!(
        gw.admin("GET", "/schemas/plugins/nope", None).await.status,
        404
    );
    let v = gw
        .admin(
            "POST",
            "/schemas/plugins/validate",
            Some(json!({"name": "request-termination", "config": {"status_code": 700}})),
        )
        .await;
    assert_eq!(v.status, 400);
    let root = gw.admin("GET", "/", None).await.json();
    assert_eq!(
        root["plugins"]["available_on_server"]["request-termination"]["priority"],
        2
    );
    // enabled_in_cluster is what the node runs: it follows the write shortly.
    let admin = gw.admin;
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            admin_call(admin, "GET", "/", None).await.json()["plugins"]["enabled_in_cluster"]
                == json!(["request-termination"])
        })
        .await
    );
    assert!(
        gw.admin("GET", "/plugins/enabled", None).await.json()["enabled_plugins"]
            .as_array()
            .unwrap()
            .contains(&json!("request-termination"))
    );
}

#[tokio::test]
async fn ip_restriction_runs_first_and_honours_trusted_proxies() {
    let up = Upstream::start("ip");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: denied
    paths: [/denied]
    plugins:
    - name: ip-restriction
      config: {{deny: [127.0.0.1]}}
  - name: allowlist
    paths: [/allowlist]
    plugins:
    - name: ip-restriction
      config: {{allow: [10.0.0.0/8], status: 401, message: "go away"}}
  - name: local
    paths: [/local]
    plugins:
    - name: ip-restriction
      config: {{allow: [127.0.0.0/8, "::1"]}}
  - name: both
    paths: [/both]
    plugins:
    - name: request-termination
      config: {{status_code: 418}}
    - name: ip-restriction
      config: {{deny: [127.0.0.1]}}
  - name: behind-proxy
    paths: [/behind-proxy]
    plugins:
    - name: ip-restriction
      config: {{deny: [203.0.113.7]}}
"#,
        url = up.url()
    ))
    .env("TURNPIKE_TRUSTED_IPS", "127.0.0.1")
    .start();
    let r = get(gw.proxy, "x", "/denied").await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.json(),
        json!({"message": "Your IP address is not allowed"})
    );
    let r = get(gw.proxy, "x", "/allowlist").await;
    assert_eq!((r.status, r.json()), (401, json!({"message": "go away"})));
    assert_eq!(get(gw.proxy, "x", "/local").await.status, 200);
    // PRIORITY: ip-restriction (990) before request-termination (2).
    assert_eq!(get(gw.proxy, "x", "/both").await.status, 403);
    // From a trusted proxy, the client is the one X-Real-IP names.
    assert_eq!(get(gw.proxy, "x", "/behind-proxy").await.status, 200);
    let r = send(
        gw.proxy,
        req("GET", "/behind-proxy")
            .header("x-real-ip", "203.0.113.7")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 403);

    // A bad list is refused with the entity and field named.
    let bad = write(
        gw.dir.path(),
        "bad.yml",
        "_format_version: '3.0'\nplugins:\n- name: ip-restriction\n  config: {allow: [10.0.0.0/40]}\n",
    );
    let (ok, out) = run(&["config", "parse", bad.to_str().unwrap()], &[]);
    assert!(!ok);
    assert!(
        out.contains("config.allow.1: invalid ip or cidr range"),
        "{out}"
    );
}

#[tokio::test]
async fn correlation_id_goes_upstream_and_back() {
    let up = Upstream::start("cid");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: r
    paths: [/r]
plugins:
- name: correlation-id
  config: {{header_name: X-Correlation, echo_downstream: true}}
"#,
        url = up.url()
    ))
    .start();
    let r = get(gw.proxy, "x", "/r").await;
    assert_eq!(r.status, 200);
    let echoed = r.header("x-correlation").unwrap().to_string();
    assert!(echoed.ends_with("#1"), "{echoed}");
    assert_eq!(r.json()["headers"]["x-correlation"], echoed);
    let r2 = get(gw.proxy, "x", "/r").await;
    assert!(r2.header("x-correlation").unwrap().ends_with("#2"));
    // The client's own id is kept.
    let r = send(
        gw.proxy,
        req("GET", "/r")
            .header("x-correlation", "mine")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(r.header("x-correlation"), Some("mine"));
    assert_eq!(r.json()["headers"]["x-correlation"], "mine");
    // A request no route matches runs no plugin (Kong runs only global rewrite-phase ones).
    assert!(get(gw.proxy, "x", "/nowhere")
        .await
        .header("x-correlation")
        .is_none());
}
