//! The plugin pipeline on the real binary: Kong's scoping precedence, PRIORITY order, config
//! validation through declarative files and the Admin API, with request-termination as the
//! first bundled plugin. Each plugin's own tests are in the file named after it.

mod acl;
mod basic_auth;
mod correlation_id;
mod cors;
mod hmac_auth;
mod ip_restriction;
mod jwt;
mod key_auth;
mod ldap_auth;
mod network_logs;
mod oauth2;
mod opentelemetry;
mod proxy_cache;
mod rate_limiting;
mod rate_limiting_redis;
mod request_size_limiting;
mod request_transformer;
mod response_ratelimiting;
mod response_transformer;
mod serverless;
mod session;
mod traffic;
mod zipkin;

use crate::common::*;
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
    gw.add_service_route(&up.url(), "/p").await;
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
    let status = &schema["fields"][11]["config"]["fields"][0]["status_code"];
    assert_eq!(status["default"], 503, "{schema}");
    assert_eq!(status["between"], json!([100, 599]), "{schema}");
    // Records are required (decK fills them with defaults rather than expecting null),
    // and deprecated flat fields are listed as Kong lists them.
    let rl = gw
        .admin("GET", "/schemas/plugins/rate-limiting", None)
        .await
        .json();
    let config = &rl["fields"][11]["config"];
    let redis = config["fields"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|f| f.get("redis"))
        .unwrap();
    assert_eq!(redis["type"], "record", "{rl}");
    assert_eq!(redis["required"], true, "{rl}");
    assert_eq!(
        config["shorthand_fields"][0]["redis_host"]["translate_backwards"],
        json!(["redis", "host"]),
        "{rl}"
    );
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

/// Consumer-scoped configs, in Kong's precedence: Route+Service+Consumer > Route+Consumer >
/// Service+Consumer > Route+Service > Consumer > Route > Service > Global.
#[tokio::test]
async fn consumer_scoped_plugins_follow_kong_precedence() {
    let up = Upstream::start("consumer-scoped");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
consumers:
- username: alice
  keyauth_credentials: [{{key: ka}}]
  plugins:
  - name: rate-limiting
    service: svc
    config: {{year: 1}}
- username: bob
  keyauth_credentials: [{{key: kb}}]
- username: carol
  keyauth_credentials: [{{key: kc}}]
  plugins:
  - name: request-termination
    config: {{status_code: 403, message: "carol is blocked"}}
- username: guest
  plugins:
  - name: request-termination
    config: {{status_code: 401, message: "please log in"}}
services:
- name: svc
  url: {url}
  plugins:
  - name: rate-limiting
    config: {{year: 100}}
  routes:
  - name: r1
    paths: [/r1]
  - name: r2
    paths: [/r2]
  - name: r3
    paths: [/r3]
- name: other
  url: {url}
  routes:
  - name: o
    paths: [/o]
plugins:
- name: key-auth
  config: {{anonymous: guest}}
- name: rate-limiting
  route: r2
  consumer: bob
  config: {{year: 2}}
- name: rate-limiting
  route: r2
  service: svc
  consumer: alice
  config: {{year: 3}}
- name: rate-limiting
  route: r2
  service: svc
  config: {{year: 50}}
- name: request-termination
  route: r3
  service: svc
  config: {{trigger: x-never}}
"#,
        url = up.url()
    ))
    .start();
    let p = gw.proxy;
    let limit = |r: &Reply| r.header("x-ratelimit-limit-year").map(String::from);
    // Service+Consumer beats Service.
    let r = call(p, "GET", "/r1", &[("apikey", "ka")]).await;
    assert_eq!((r.status, limit(&r).as_deref()), (200, Some("1")));
    assert_eq!(call(p, "GET", "/r1", &[("apikey", "ka")]).await.status, 429);
    let r = call(p, "GET", "/r1", &[("apikey", "kb")]).await;
    assert_eq!(limit(&r).as_deref(), Some("100"));
    // Route+Consumer beats Route+Service; Route+Service+Consumer beats them all.
    let r = call(p, "GET", "/r2", &[("apikey", "kb")]).await;
    assert_eq!(limit(&r).as_deref(), Some("2"));
    let r = call(p, "GET", "/r2", &[("apikey", "ka")]).await;
    assert_eq!(limit(&r).as_deref(), Some("3"));
    // Without a consumer-scoped config, Route+Service applies.
    let r = call(p, "GET", "/r2", &[]).await;
    assert_eq!(limit(&r).as_deref(), Some("50"));
    // A Consumer-only config applies everywhere...
    let r = call(p, "GET", "/r1", &[("apikey", "kc")]).await;
    assert_eq!(
        (r.status, r.json()),
        (403, json!({"message": "carol is blocked"}))
    );
    assert_eq!(call(p, "GET", "/o", &[("apikey", "kc")]).await.status, 403);
    // ...but a Route+Service config of the same plugin outranks it.
    assert_eq!(call(p, "GET", "/r3", &[("apikey", "kc")]).await.status, 200);
    // The anonymous consumer is a consumer too.
    let r = call(p, "GET", "/o", &[]).await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "please log in"}))
    );
    assert_eq!(call(p, "GET", "/o", &[("apikey", "kb")]).await.status, 200);
}

/// Plugins that decide who the consumer is cannot be scoped to one (Kong's `no_consumer`).
#[tokio::test]
async fn auth_plugins_cannot_be_scoped_to_a_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "k.yml",
        "_format_version: '3.0'\nconsumers:\n- username: a\n  plugins:\n  - name: key-auth\n",
    );
    let (ok, out) = run(&["config", "parse", f.to_str().unwrap()], &[]);
    assert!(!ok);
    assert!(out.contains("consumer: value must be null"), "{out}");
    let up = Upstream::start("consumer-admin");
    let gw = Gateway::sqlite().start();
    gw.add_service_route(&up.url(), "/c").await;
    let r = gw
        .admin("POST", "/consumers", Some(json!({"username": "a"})))
        .await;
    assert_eq!(r.status, 201);
    for (name, config) in [
        ("key-auth", json!({})),
        ("basic-auth", json!({})),
        ("acl", json!({"allow": ["x"]})),
        ("cors", json!({})),
    ] {
        let body = json!({"name": name, "config": config});
        let r = gw.admin("POST", "/consumers/a/plugins", Some(body)).await;
        assert_eq!(r.status, 400, "{name}");
        assert_eq!(
            r.json()["fields"]["consumer"],
            "value must be null",
            "{name}"
        );
    }
    // Through the Admin API, a consumer-scoped plugin takes effect for that consumer only.
    for (path, body) in [
        ("/services/s/plugins", json!({"name": "key-auth"})),
        ("/consumers/a/key-auth", json!({"key": "ka"})),
        ("/consumers", json!({"username": "b"})),
        ("/consumers/b/key-auth", json!({"key": "kb"})),
        (
            "/consumers/a/plugins",
            json!({"name": "request-termination", "config": {"status_code": 451}}),
        ),
    ] {
        let r = gw.admin("POST", path, Some(body)).await;
        assert_eq!(r.status, 201, "{path}: {}", r.json());
    }
    let proxy = gw.proxy;
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            call(proxy, "GET", "/c", &[("apikey", "ka")]).await.status == 451
        })
        .await
    );
    assert_eq!(
        call(proxy, "GET", "/c", &[("apikey", "kb")]).await.status,
        200
    );
}

/// Kong's `plugins` property: which plugins a node loads.
#[tokio::test]
async fn the_plugins_property_chooses_what_loads() {
    let gw = Gateway::sqlite()
        .env("TURNPIKE_PLUGINS", "key-auth, rate-limiting")
        .start();
    let r = gw.admin("GET", "/plugins/enabled", None).await;
    assert_eq!(
        r.json(),
        json!({"enabled_plugins": ["key-auth", "rate-limiting"]})
    );
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(json!({"name": "acl", "config": {"allow": ["a"]}})),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["fields"]["name"],
        "plugin 'acl' not enabled; add it to the 'plugins' configuration property"
    );
    let r = gw
        .admin("POST", "/plugins", Some(json!({"name": "key-auth"})))
        .await;
    assert_eq!(r.status, 201);

    // `bundled` mixed with names; `off`; an unknown name stops the start with a clear error.
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "k.yml",
        "_format_version: '3.0'\nplugins:\n- name: cors\n",
    );
    let file = f.to_str().unwrap();
    let (ok, _) = run(
        &["config", "parse", file],
        &[("TURNPIKE_PLUGINS", "bundled,cors")],
    );
    assert!(ok);
    let (ok, out) = run(&["config", "parse", file], &[("TURNPIKE_PLUGINS", "off")]);
    assert!(!ok);
    assert!(out.contains("plugin 'cors' not enabled"), "{out}");
    let (ok, out) = run(
        &["config", "parse", file],
        &[("TURNPIKE_PLUGINS", "cors,nope")],
    );
    assert!(!ok);
    // Not bundled: looked for as a custom Lua plugin (`lua_package_path`), in Kong's words.
    assert!(
        out.contains("plugin 'nope' enabled but not installed"),
        "{out}"
    );
    let (ok, out) = run(&["start"], &[("TURNPIKE_PLUGINS", "nope")]);
    assert!(!ok);
    assert!(
        out.contains("plugin 'nope' enabled but not installed"),
        "{out}"
    );
}

/// A plugin's `protocols` say which requests it runs for.
#[tokio::test]
async fn plugins_run_only_for_their_protocols() {
    let up = Upstream::start("protocols");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: r
    paths: [/p]
    plugins:
    - name: request-termination
      protocols: [https]
      config: {{status_code: 418}}
"#,
        url = up.url()
    ))
    .start();
    assert_eq!(get(gw.proxy, "x", "/p").await.status, 200);
    let (r, _, _) = get_tls(gw.proxy_tls, "localhost", "/p", false).await;
    assert_eq!(r.status, 418);
}
