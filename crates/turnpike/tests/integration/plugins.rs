//! The plugin pipeline on the real binary: Kong's scoping precedence, PRIORITY order, config
//! validation through declarative files and the Admin API, with request-termination as the
//! first bundled plugin.

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

#[tokio::test]
async fn key_auth_identifies_consumers() {
    let up = Upstream::start("keys");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
consumers:
- username: alice
  custom_id: A-1
  keyauth_credentials:
  - key: alice-key
- username: guest
- username: dora
  keyauth_credentials:
  - key: "{dora_digest}"
services:
- name: svc
  url: {url}
  routes:
  - name: plain
    paths: [/plain]
    plugins:
    - name: key-auth
  - name: hidden
    paths: [/hidden]
    plugins:
    - name: key-auth
      config: {{key_names: [x-api-key], hide_credentials: true, realm: api, run_on_preflight: false}}
  - name: open
    paths: [/open]
    plugins:
    - name: key-auth
      config: {{anonymous: guest}}
  - name: broken
    paths: [/broken]
    plugins:
    - name: key-auth
      config: {{anonymous: nobody}}
"#,
        url = up.url(),
        // A key stored as its digest (a Turnpike export): the key itself still works.
        dora_digest = {
            use sha2::Digest;
            format!("$sha256${}", hex::encode(sha2::Sha256::digest(b"dora-key")))
        }
    ))
    .start();
    let p = gw.proxy;
    // No key, a wrong key: Kong's 401s and challenge.
    let r = call(p, "GET", "/plain", &[]).await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "No API key found in request"}))
    );
    assert_eq!(r.header("www-authenticate"), Some("Key"));
    let r = call(p, "GET", "/plain", &[("apikey", "nope")]).await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Unauthorized"}))
    );
    let r = call(
        p,
        "GET",
        "/plain",
        &[("apikey", "alice-key"), ("apikey", "alice-key")],
    )
    .await;
    assert_eq!(r.status, 401);
    // By header and by query; the upstream learns who it is, and spoofed identity headers go.
    let r = call(
        p,
        "GET",
        "/plain",
        &[
            ("apikey", "alice-key"),
            ("x-consumer-username", "mallory"),
            ("x-anonymous-consumer", "true"),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let h = r.json()["headers"].clone();
    assert_eq!(h["x-consumer-username"], "alice");
    assert_eq!(h["x-consumer-custom-id"], "A-1");
    assert!(h["x-consumer-id"].is_string() && h["x-credential-identifier"].is_string());
    assert!(h["x-anonymous-consumer"].is_null());
    assert_eq!(h["apikey"], "alice-key");
    // Huge and non-ASCII keys: Kong's 401, nothing worse.
    let huge = "k".repeat(6000);
    let r = call(p, "GET", "/plain", &[("apikey", huge.as_str())]).await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Unauthorized"}))
    );
    let r = call(p, "GET", &format!("/plain?apikey={huge}"), &[]).await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Unauthorized"}))
    );
    let r = send(
        p,
        req("GET", "/plain")
            .header(
                "apikey",
                http::HeaderValue::from_bytes(&[0xff, 0xfe, b'k']).unwrap(),
            )
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Unauthorized"}))
    );
    let r = call(p, "GET", "/plain", &[("apikey", "dora-key")]).await;
    assert_eq!(r.json()["headers"]["x-consumer-username"], "dora");
    let r = call(p, "GET", "/plain?apikey=alice-key&x=1", &[]).await;
    assert_eq!(r.status, 200);
    // strip_path (default on) leaves "/" of the path.
    assert_eq!(r.json()["uri"], "/?apikey=alice-key&x=1");

    // hide_credentials removes the key from the header or the query; realm; preflight.
    let r = call(p, "GET", "/hidden", &[("x-api-key", "alice-key")]).await;
    assert_eq!(r.status, 200);
    assert!(r.json()["headers"]["x-api-key"].is_null());
    let r = call(p, "GET", "/hidden?a=1&x-api-key=alice-key", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["uri"], "/?a=1");
    let r = call(p, "GET", "/hidden", &[]).await;
    assert_eq!(r.header("www-authenticate"), Some("Key realm=\"api\""));
    assert_eq!(call(p, "OPTIONS", "/hidden", &[]).await.status, 200);

    // anonymous: no key is the anonymous consumer; a good key still identifies.
    let r = call(p, "GET", "/open", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["headers"]["x-anonymous-consumer"], "true");
    assert_eq!(r.json()["headers"]["x-consumer-username"], "guest");
    let r = call(p, "GET", "/open", &[("apikey", "alice-key")]).await;
    assert_eq!(r.json()["headers"]["x-consumer-username"], "alice");
    let r = call(p, "GET", "/broken", &[]).await;
    assert_eq!(r.status, 500);
    assert!(r.json()["message"]
        .as_str()
        .unwrap()
        .contains("anonymous consumer nobody"));
}

#[tokio::test]
async fn key_auth_credentials_through_the_admin_api() {
    key_auth_credentials(false).await;
}

/// `key_auth_hash_keys = on`: the store keeps digests, the key is shown once.
#[tokio::test]
async fn key_auth_credentials_hashed_at_rest() {
    key_auth_credentials(true).await;
}

async fn key_auth_credentials(hashed: bool) {
    let up = Upstream::start("keys-admin");
    let gw = Gateway::sqlite()
        .env(
            "TURNPIKE_KEY_AUTH_HASH_KEYS",
            if hashed { "on" } else { "off" },
        )
        .start();
    gw.add_service_route(&up.url(), "/k").await;
    assert_eq!(
        gw.admin(
            "POST",
            "/services/s/plugins",
            Some(json!({"name": "key-auth"}))
        )
        .await
        .status,
        201
    );
    assert_eq!(
        gw.admin("POST", "/consumers", Some(json!({"username": "bob"})))
            .await
            .status,
        201
    );
    let k = gw.admin("POST", "/consumers/bob/key-auth", None).await;
    assert_eq!(k.status, 201);
    let key = k.json()["key"].as_str().unwrap().to_string();
    assert_eq!(key.len(), 32, "{key}");
    let id = k.json()["id"].as_str().unwrap().to_string();
    let stored = gw.admin("GET", &format!("/key-auths/{id}"), None).await;
    let read_back = stored.json()["key"].as_str().unwrap().to_string();
    let db = std::fs::read(gw.dir.path().join("prefix/turnpike.db")).unwrap_or_default();
    if hashed {
        // The generated key is shown once, in this answer; the store keeps only its digest.
        assert!(
            read_back.starts_with("$sha256$") && read_back.len() == 8 + 64,
            "{read_back}"
        );
        assert!(!db.windows(key.len()).any(|w| w == key.as_bytes()));
    } else {
        // Kong's behaviour: the key reads back as written (decK compares it with its file).
        assert_eq!(read_back, key);
        let listed = gw.admin("GET", "/consumers/bob/key-auth", None).await;
        assert_eq!(listed.json()["data"][0]["key"], key.as_str());
    }
    // Found by the key itself, as Kong's endpoint key allows; a second copy is a conflict.
    let r = gw.admin("GET", &format!("/key-auths/{key}"), None).await;
    assert_eq!(
        (r.status, r.json()["id"].as_str()),
        (200, Some(id.as_str()))
    );
    let r = gw
        .admin("POST", "/consumers/bob/key-auth", Some(json!({"key": key})))
        .await;
    assert_eq!(r.status, 409, "{}", r.json());
    let proxy = gw.proxy;
    // The node applies Admin API writes through its config sync: wait for key-auth to be on
    // (a loaded machine can take longer than the calls above).
    until_status(proxy, "/k", 401).await;
    // A key asked for before it exists is cached as missing; creating it ends that at once.
    for _ in 0..2 {
        let r = call(proxy, "GET", "/k", &[("apikey", "chosen-key")]).await;
        assert_eq!(r.status, 401);
    }
    let r = gw
        .admin(
            "POST",
            "/consumers/bob/key-auth",
            Some(json!({"key": "chosen-key"})),
        )
        .await;
    assert_eq!(
        (r.status, r.json()["key"].as_str()),
        (201, Some("chosen-key"))
    );
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            call(proxy, "GET", "/k", &[("apikey", "chosen-key")])
                .await
                .status
                == 200
        })
        .await
    );
    // Renaming the consumer reaches the identity cached with its key.
    let r = gw
        .admin(
            "PATCH",
            "/consumers/bob",
            Some(json!({"username": "robert"})),
        )
        .await;
    assert_eq!(r.status, 200);
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            call(proxy, "GET", "/k", &[("apikey", "chosen-key")])
                .await
                .json()["headers"]["x-consumer-username"]
                == "robert"
        })
        .await
    );
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            call(proxy, "GET", "/k", &[("apikey", key.as_str())])
                .await
                .status
                == 200
        })
        .await
    );
    // Deleting the consumer revokes the key.
    assert_eq!(
        gw.admin("DELETE", "/consumers/robert", None).await.status,
        204
    );
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            call(proxy, "GET", "/k", &[("apikey", key.as_str())])
                .await
                .status
                == 401
        })
        .await
    );
    // Bad key-auth configs are Kong-shaped schema violations.
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(json!({"name": "key-auth", "config": {"key_names": ["bad name"]}})),
        )
        .await;
    assert_eq!(r.status, 400);
    assert!(
        r.json()["fields"]["config"]["key_names"]["1"]
            .as_str()
            .unwrap()
            .starts_with("bad header name 'bad name'"),
        "{:?}",
        r.json()
    );
}

// Rate-limit tests use the `year` window: a test never straddles its boundary, where a
// minute or hour window could reset in the middle of a CI run.
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

#[tokio::test]
async fn acl_after_authentication() {
    let up = Upstream::start("acl");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
consumers:
- username: alice
  keyauth_credentials: [{{key: ka}}]
  acls: [{{group: admins}}, {{group: ops}}]
- username: bob
  keyauth_credentials: [{{key: kb}}]
  acls: [{{group: users}}]
services:
- name: svc
  url: {url}
  routes:
  - name: admin
    paths: [/admin]
    plugins:
    - name: key-auth
    - name: acl
      config: {{allow: [admins]}}
  - name: no-users
    paths: [/no-users]
    plugins:
    - name: key-auth
    - name: acl
      config: {{deny: [users], hide_groups_header: true}}
  - name: unauthenticated
    paths: [/unauth]
    plugins:
    - name: acl
      config: {{allow: [admins]}}
"#,
        url = up.url()
    ))
    .start();
    let p = gw.proxy;
    let r = call(
        p,
        "GET",
        "/admin",
        &[("apikey", "ka"), ("x-consumer-groups", "forged")],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["headers"]["x-consumer-groups"], "admins, ops");
    let r = call(p, "GET", "/admin", &[("apikey", "kb")]).await;
    assert_eq!(
        (r.status, r.json()),
        (403, json!({"message": "You cannot consume this service"}))
    );
    assert_eq!(
        call(p, "GET", "/no-users", &[("apikey", "kb")])
            .await
            .status,
        403
    );
    let r = call(p, "GET", "/no-users", &[("apikey", "ka")]).await;
    assert_eq!(r.status, 200);
    assert!(r.json()["headers"]["x-consumer-groups"].is_null());
    let r = call(p, "GET", "/unauth", &[]).await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Unauthorized"}))
    );
    // Both lists, or neither: refused.
    let bad = write(
        gw.dir.path(),
        "bad.yml",
        "_format_version: '3.0'\nplugins:\n- name: acl\n  config: {allow: [a], deny: [b]}\n",
    );
    let (ok, out) = run(&["config", "parse", bad.to_str().unwrap()], &[]);
    assert!(!ok && out.contains("only one of these fields"), "{out}");
}

#[tokio::test]
async fn cors_answers_preflights_and_decorates_responses() {
    let up = Upstream::start("cors");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: r
    paths: [/api]
    plugins:
    - name: cors
      config: {{origins: ["https://app.test", "https://.*\\.app\\.test"], credentials: true, max_age: 300}}
"#,
        url = up.url()
    ))
    .start();
    let p = gw.proxy;
    let r = call(
        p,
        "OPTIONS",
        "/api",
        &[
            ("origin", "https://eu.app.test"),
            ("access-control-request-method", "POST"),
            ("access-control-request-headers", "x-token"),
        ],
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(
        r.header("x-upstream").is_none(),
        "a preflight is answered by the gateway"
    );
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://eu.app.test")
    );
    assert_eq!(r.header("access-control-allow-headers"), Some("x-token"));
    assert_eq!(r.header("access-control-max-age"), Some("300"));
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    let r = call(p, "GET", "/api", &[("origin", "https://app.test")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-upstream"), Some("cors"));
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.test")
    );
    assert_eq!(r.header("vary"), Some("Origin"));
    let r = call(p, "GET", "/api", &[("origin", "https://evil.test")]).await;
    assert!(r.header("access-control-allow-origin").is_none());
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
    assert!(
        out.contains("plugins: 'nope' is not a plugin this build carries"),
        "{out}"
    );
    let (ok, out) = run(&["start"], &[("TURNPIKE_PLUGINS", "nope")]);
    assert!(!ok);
    assert!(out.contains("'nope' is not a plugin"), "{out}");
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

/// key-auth's key_in_body: URL-encoded, JSON and multipart bodies, read whole before the
/// chain runs; hide_credentials takes the key out of the body the upstream gets.
#[tokio::test]
async fn key_auth_reads_keys_from_bodies() {
    let up = Upstream::start("keys-body");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
consumers:
- username: alice
  keyauth_credentials: [{{key: alice-key}}]
services:
- name: svc
  url: {url}
  routes:
  - name: hidden
    paths: [/hidden]
    plugins:
    - name: key-auth
      config: {{key_in_body: true, key_in_header: false, key_in_query: false, hide_credentials: true}}
  - name: kept
    paths: [/kept]
    plugins:
    - name: key-auth
      config: {{key_in_body: true}}
"#,
        url = up.url()
    ))
    .start();
    let p = gw.proxy;
    let post = |path: &'static str, ct: &'static str, body: Vec<u8>| async move {
        send(
            p,
            req("POST", path)
                .header("content-type", ct)
                .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                .unwrap(),
        )
        .await
    };
    let r = post(
        "/hidden",
        "application/x-www-form-urlencoded",
        b"x=1&apikey=alice-key".to_vec(),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["headers"]["x-consumer-username"], "alice");
    assert_eq!(r.json()["body_len"], 3);
    assert_eq!(r.json()["headers"]["content-length"], "3");
    let r = post(
        "/hidden",
        "application/json",
        br#"{"apikey": "alice-key", "a": 1}"#.to_vec(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["body_len"], br#"{"a":1}"#.len());
    let multipart = b"--B\r\nContent-Disposition: form-data; name=\"apikey\"\r\n\r\nalice-key\r\n--B\r\nContent-Disposition: form-data; name=\"f\"\r\n\r\nv\r\n--B--\r\n";
    let r = post(
        "/hidden",
        "multipart/form-data; boundary=B",
        multipart.to_vec(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.json()["body_len"].as_u64().unwrap() < multipart.len() as u64);
    // Not in the body (and header and query are off here): Kong's 401s.
    let r = post("/hidden", "application/json", br#"{"a": 1}"#.to_vec()).await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "No API key found in request"}))
    );
    let r = post("/hidden", "application/json", b"{broken".to_vec()).await;
    assert_eq!(r.status, 401);
    let r = call(p, "GET", "/hidden", &[("apikey", "alice-key")]).await;
    assert_eq!(r.status, 401);
    let r = post(
        "/hidden",
        "application/x-www-form-urlencoded",
        b"apikey=wrong".to_vec(),
    )
    .await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Unauthorized"}))
    );
    // Without hide_credentials the upstream gets the body as sent; headers still work.
    let body = b"apikey=alice-key&payload=0123456789".to_vec();
    let r = post("/kept", "application/x-www-form-urlencoded", body.clone()).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["body_len"], body.len());
    let r = call(p, "GET", "/kept", &[("apikey", "alice-key")]).await;
    assert_eq!(r.status, 200);
    // A body too large to read whole for the plugin: 413, not unbounded memory.
    let r = post(
        "/kept",
        "application/x-www-form-urlencoded",
        vec![b'a'; 9 << 20],
    )
    .await;
    assert_eq!(r.status, 413);
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
