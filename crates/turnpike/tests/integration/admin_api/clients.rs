//! The Admin API as Kong's own clients use it: decK's call sequence, Kong Manager's and other
//! clients' requests, Kong's other paths, credentials with a ttl.

use super::*;

#[tokio::test]
async fn deck_call_sequence() {
    let up = Upstream::start("deck-up");
    let gw = Gateway::sqlite().start();
    // ping
    let root = gw.admin("GET", "/", None).await.json();
    assert!(root["version"].as_str().unwrap().split('.').count() == 3);
    // dump: required lists with size=1000, optional ones may 404.
    for p in [
        "/services",
        "/routes",
        "/plugins",
        "/certificates",
        "/snis",
        "/upstreams",
        "/consumers",
        "/ca_certificates",
        "/key-auths",
        "/basic-auths",
        "/hmac-auths",
        "/jwts",
        "/oauth2",
        "/acls",
        "/vaults",
        "/keys",
        "/key-sets",
    ] {
        let r = gw.admin("GET", &format!("{p}?size=1000"), None).await;
        assert_eq!(r.status, 200, "{p}");
        assert_eq!(r.json()["data"], json!([]), "{p}");
    }
    for p in ["/consumer_groups", "/filter-chains"] {
        assert_eq!(
            gw.admin("GET", &format!("{p}?size=1000"), None)
                .await
                .status,
            404,
            "{p}"
        );
    }
    // Schemas for defaults.
    for e in ["services", "routes", "upstreams", "targets"] {
        let s = gw.admin("GET", &format!("/schemas/{e}"), None).await;
        assert_eq!(s.status, 200);
        assert!(s.json()["fields"].as_array().unwrap().len() > 3);
    }
    // Kong's full shape: choices, bounds, elements, nested records with their defaults.
    let field = |schema: &serde_json::Value, name: &str| -> serde_json::Value {
        schema["fields"]
            .as_array()
            .unwrap()
            .iter()
            .find_map(|f| f.get(name).cloned())
            .unwrap_or_else(|| panic!("no field {name} in {schema}"))
    };
    let services = gw.admin("GET", "/schemas/services", None).await.json();
    assert_eq!(field(&services, "port")["between"], json!([0, 65535]));
    assert!(field(&services, "protocol")["one_of"]
        .as_array()
        .unwrap()
        .contains(&json!("https")));
    assert_eq!(field(&services, "tags")["elements"]["type"], "string");
    let upstreams = gw.admin("GET", "/schemas/upstreams", None).await.json();
    let hc = field(&upstreams, "healthchecks");
    assert_eq!(hc["type"], "record", "{hc}");
    let active = hc["fields"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|f| f.get("active").cloned())
        .unwrap();
    assert_eq!(active["required"], true, "{active}");
    let routes = gw.admin("GET", "/schemas/routes", None).await.json();
    assert_eq!(field(&routes, "headers")["values"]["type"], "array");
    for table in ["key_sets", "keys", "vaults"] {
        let s = gw.admin("GET", &format!("/schemas/{table}"), None).await;
        assert_eq!(s.status, 200, "{table}");
    }
    // sync: PUT by id creates, then updates; nested credential and target PUTs; DELETE by id.
    let sid = "0b5c8a3e-5d6f-4a8b-9c0d-1e2f3a4b5c6d";
    let rid = "1c6d9b4f-6e70-4b9c-8d1e-2f3a4b5c6d7e";
    let cid = "2d7eac50-7f81-4cad-9e2f-3a4b5c6d7e8f";
    let kid = "3e8fbd61-8092-4dbe-af30-4b5c6d7e8f90";
    let uid = "4f90ce72-91a3-4ecf-b041-5c6d7e8f9001";
    let tid = "50a1df83-a2b4-4fd0-8152-6d7e8f900112";
    assert_eq!(
        gw.admin(
            "PUT",
            &format!("/services/{sid}"),
            Some(json!({"name": "svc", "host": "127.0.0.1", "port": up.addr.port()}))
        )
        .await
        .status,
        200
    );
    assert_eq!(
        gw.admin(
            "PUT",
            &format!("/routes/{rid}"),
            Some(json!({"name": "rt", "paths": ["/deck"], "service": {"id": sid}}))
        )
        .await
        .status,
        200
    );
    assert_eq!(until_status(gw.proxy, "/deck", 200).await.status, 200);
    let r = gw
        .admin(
            "PUT",
            &format!("/services/{sid}"),
            Some(json!({"name": "svc", "host": "127.0.0.1", "port": up.addr.port(), "retries": 1})),
        )
        .await;
    assert_eq!((r.status, r.json()["retries"].clone()), (200, json!(1)));
    assert_eq!(
        gw.admin(
            "PUT",
            &format!("/consumers/{cid}"),
            Some(json!({"username": "bob"}))
        )
        .await
        .status,
        200
    );
    let r = gw
        .admin(
            "PUT",
            &format!("/consumers/{cid}/key-auth/{kid}"),
            Some(json!({"key": "bob-key"})),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        gw.admin(
            "PUT",
            &format!("/upstreams/{uid}"),
            Some(json!({"name": "pool"}))
        )
        .await
        .status,
        200
    );
    let r = gw
        .admin(
            "PUT",
            &format!("/upstreams/{uid}/targets/{tid}"),
            Some(json!({"target": "127.0.0.1:1"})),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let dump = gw
        .admin("GET", &format!("/upstreams/{uid}/targets?size=1000"), None)
        .await
        .json();
    assert_eq!(ids(&dump), vec![tid.to_string()]);
    assert_eq!(
        gw.admin("DELETE", &format!("/routes/{rid}"), None)
            .await
            .status,
        204
    );
    assert_eq!(
        gw.admin("DELETE", &format!("/services/{sid}"), None)
            .await
            .status,
        204
    );
    assert_eq!(until_status(gw.proxy, "/deck", 404).await.status, 404);
    // validate --online
    let v = gw
        .admin(
            "POST",
            "/schemas/services/validate",
            Some(json!({"host": "h"})),
        )
        .await;
    assert_eq!(v.status, 200);
    let v = gw
        .admin(
            "POST",
            "/schemas/routes/validate",
            Some(json!({"paths": ["no-slash"]})),
        )
        .await;
    assert_eq!(v.status, 400);
}

#[tokio::test]
async fn behaves_as_kong_for_its_clients() {
    let gw = Gateway::sqlite().start();
    // GET /consumers?custom_id=X: only that consumer.
    for (u, c) in [("ann", "c-1"), ("ben", "c-2")] {
        let r = gw
            .admin(
                "POST",
                "/consumers",
                Some(json!({"username": u, "custom_id": c})),
            )
            .await;
        assert_eq!(r.status, 201);
    }
    let r = gw
        .admin("GET", "/consumers?custom_id=c-2", None)
        .await
        .json();
    let data = r["data"].as_array().unwrap();
    assert_eq!(data.len(), 1, "{r}");
    assert_eq!(data[0]["username"], "ben");
    let r = gw
        .admin("GET", "/consumers?custom_id=none", None)
        .await
        .json();
    assert_eq!(r["data"], json!([]), "{r}");
    let r = gw.admin("GET", "/services?name=nope", None).await;
    assert_eq!((r.status, r.json()["data"].clone()), (200, json!([])));

    // ACLs by group name.
    let r = gw
        .admin(
            "POST",
            "/consumers/ann/acls",
            Some(json!({"group": "admins"})),
        )
        .await;
    assert_eq!(r.status, 201);
    let r = gw.admin("GET", "/consumers/ann/acls/admins", None).await;
    assert_eq!(
        (r.status, r.json()["group"].clone()),
        (200, json!("admins"))
    );
    assert_eq!(
        gw.admin("DELETE", "/consumers/ann/acls/admins", None)
            .await
            .status,
        204
    );
    let r = gw.admin("GET", "/consumers/ann/acls", None).await.json();
    assert_eq!(r["data"], json!([]), "the ACL is gone: {r}");

    // key-auth ttl counts down.
    let r = gw
        .admin(
            "POST",
            "/consumers/ann/key-auth",
            Some(json!({"key": "short-lived", "ttl": 100})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    let r = gw.admin("GET", "/key-auths/short-lived", None).await.json();
    // At least 2 s have passed: the ttl read back has counted down by at least that much
    // (however slow the machine, it can only have counted down further).
    let ttl = r["ttl"].as_i64().unwrap();
    assert!(
        (0..=98).contains(&ttl),
        "ttl {ttl} should have counted down: {r}"
    );
    // As Kong counts it: the whole seconds left, so 9 as soon as any time has passed after a
    // ttl of 10 (each of three keys read 50 ms after its write; counting whole seconds of the
    // clock would read 10 unless a second boundary fell in between).
    for i in 0..3 {
        let key = format!("ten-{i}");
        let r = gw
            .admin(
                "POST",
                "/consumers/ann/key-auth",
                Some(json!({"key": key, "ttl": 10})),
            )
            .await;
        assert_eq!(r.status, 201, "{:?}", r.body);
        let written = r.json()["ttl"].as_i64().unwrap();
        assert!((0..=10).contains(&written), "{written}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        for path in [
            format!("/key-auths/{key}"),
            format!("/consumers/ann/key-auth/{key}"),
        ] {
            let r = gw.admin("GET", &path, None).await.json();
            let ttl = r["ttl"].as_i64().unwrap();
            assert!((0..=9).contains(&ttl), "{path}: ttl {ttl} after 50 ms: {r}");
        }
        let listed = gw.admin("GET", "/key-auths", None).await.json();
        let ttl = listed["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["key"] == key.as_str())
            .unwrap()["ttl"]
            .as_i64()
            .unwrap();
        assert!((0..=9).contains(&ttl), "listed: ttl {ttl}");
    }

    // Health lists a target created a moment ago; targets are stamped in seconds.ms.
    let r = gw
        .admin("POST", "/upstreams", Some(json!({"name": "up"})))
        .await;
    assert_eq!(r.status, 201);
    let hc = &r.json()["healthchecks"];
    assert_eq!(
        hc["active"]["healthy"]["http_statuses"],
        json!([200, 302]),
        "{hc}"
    );
    let r = gw
        .admin(
            "POST",
            "/upstreams/up/targets",
            Some(json!({"target": "127.0.0.1:9"})),
        )
        .await;
    assert_eq!(r.status, 201);
    let created = r.json()["created_at"].as_f64().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!((now - created).abs() < 60.0, "seconds, not ms: {created}");
    let r = gw.admin("GET", "/upstreams/up/health", None).await.json();
    assert_eq!(r["data"][0]["target"], "127.0.0.1:9", "{r}");

    // Validation as strict as Kong's.
    let r = gw
        .admin(
            "POST",
            "/upstreams",
            Some(
                json!({"name": "bad", "healthchecks": {"passive": {"unhealthy": {"interval": 5}}}}),
            ),
        )
        .await;
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(
        r.json()["fields"]["healthchecks"]["passive"]["unhealthy"]["interval"],
        "unknown field"
    );
    let r = gw
        .admin(
            "POST",
            "/services",
            Some(json!({"name": "s", "host": "example.com"})),
        )
        .await;
    assert_eq!(r.status, 201);
    let r = gw
        .admin(
            "POST",
            "/routes",
            Some(json!({"paths": ["/x"], "service": {"id": "s"}})),
        )
        .await;
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(r.json()["fields"]["service"]["id"], "expected a valid UUID");
}

/// The Admin API paths Kong 3.9 OSS serves beyond the entities (issue #21 item 6): /tags,
/// key sets and keys (JWK and PEM), vaults, /endpoints, /timers, /cache, /clustering/*.
#[tokio::test]
async fn serves_kongs_other_paths() {
    let gw = Gateway::sqlite().start();
    for (path, body) in [
        (
            "/services",
            json!({"name": "a", "host": "example.com", "tags": ["t1", "t2"]}),
        ),
        ("/consumers", json!({"username": "c", "tags": ["t2"]})),
    ] {
        assert_eq!(gw.admin("POST", path, Some(body)).await.status, 201);
    }
    let tags = gw.admin("GET", "/tags", None).await.json();
    assert_eq!(tags["data"].as_array().unwrap().len(), 3, "{tags}");
    let page = gw.admin("GET", "/tags?size=2", None).await.json();
    assert_eq!(page["data"].as_array().unwrap().len(), 2, "{page}");
    let offset = page["offset"].as_str().unwrap().to_string();
    let rest = gw
        .admin("GET", &format!("/tags?size=2&offset={offset}"), None)
        .await
        .json();
    assert_eq!(rest["data"].as_array().unwrap().len(), 1, "{rest}");
    let t2 = gw.admin("GET", "/tags/t2", None).await.json();
    assert_eq!(t2["data"].as_array().unwrap().len(), 2, "{t2}");

    // Key sets and keys: JWK or PEM, one of them, nested under their set.
    assert_eq!(
        gw.admin("POST", "/key-sets", Some(json!({"name": "ks"})))
            .await
            .status,
        201
    );
    let jwk = json!({"kid": "k1", "kty": "oct", "k": "c2VjcmV0"}).to_string();
    let r = gw
        .admin(
            "POST",
            "/key-sets/ks/keys",
            Some(json!({"name": "k1", "kid": "k1", "jwk": jwk})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.json()["pem"], serde_json::Value::Null);
    let r = gw
        .admin(
            "POST",
            "/keys",
            Some(json!({"kid": "k2", "set": {"name": "ks"}})),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["fields"]["@entity"][0],
        "at least one of these fields must be non-empty: 'jwk', 'pem'"
    );
    let keys = gw.admin("GET", "/key-sets/ks/keys", None).await.json();
    assert_eq!(keys["data"][0]["kid"], "k1", "{keys}");
    assert_eq!(gw.admin("DELETE", "/key-sets/ks", None).await.status, 204);
    let keys = gw.admin("GET", "/keys", None).await.json();
    assert_eq!(keys["data"], json!([]), "keys go with their set: {keys}");

    // Vaults, by prefix.
    let r = gw
        .admin(
            "POST",
            "/vaults",
            Some(json!({"prefix": "my-env", "name": "env", "config": {"prefix": "X_"}})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let r = gw.admin("GET", "/vaults/my-env", None).await.json();
    assert_eq!(r["config"]["prefix"], "X_");
    let r = gw
        .admin(
            "POST",
            "/vaults",
            Some(json!({"prefix": "x", "name": "aws"})),
        )
        .await;
    assert_eq!(r.status, 400);

    // The node's own endpoints.
    let e = gw.admin("GET", "/endpoints", None).await.json();
    let list = e["data"].as_array().unwrap();
    for p in [
        "/services/{services}/routes",
        "/key-sets/{key_sets}/keys",
        "/vaults",
        "/tags/{tags}",
    ] {
        assert!(list.contains(&json!(p)), "{p} missing: {e}");
    }
    assert_eq!(gw.admin("GET", "/timers", None).await.status, 200);
    let s = gw.admin("GET", "/schemas/tags", None).await.json();
    assert_eq!(s["fields"][0]["tag"]["required"], true, "{s}");
    assert_eq!(gw.admin("DELETE", "/cache", None).await.status, 204);
    assert_eq!(gw.admin("GET", "/cache/some-key", None).await.status, 404);
    for p in ["/clustering/status", "/clustering/data-planes"] {
        let r = gw.admin("GET", p, None).await;
        assert_eq!(r.status, 400, "{p}");
        assert!(r.json()["message"]
            .as_str()
            .unwrap()
            .contains("only available when Kong is configured to run as Control Plane"));
    }
}

/// A key-auth key written with a `ttl` works until it runs out, then not, on a node that has
/// it cached too (Kong's credential ttl).
#[tokio::test]
async fn a_key_with_a_ttl_expires() {
    let up = Upstream::start("ttl");
    let gw = Gateway::sqlite().start();
    gw.add_service_route(&up.url(), "/t").await;
    let r = gw
        .admin(
            "POST",
            "/services/s/plugins",
            Some(json!({"name": "key-auth"})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(
        gw.admin("POST", "/consumers", Some(json!({"username": "tim"})))
            .await
            .status,
        201
    );
    let proxy = gw.proxy;
    until_status(proxy, "/t", 401).await;
    // A key without a ttl works; one with a ttl of 2 s works until then (checked only while
    // that is certainly the case), is cached by the node, and no longer works after it.
    let r = gw
        .admin(
            "POST",
            "/consumers/tim/key-auth",
            Some(json!({"key": "lasting"})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            call(proxy, "GET", "/t", &[("apikey", "lasting")])
                .await
                .status
                == 200
        })
        .await
    );
    let written = std::time::Instant::now();
    let r = gw
        .admin(
            "POST",
            "/consumers/tim/key-auth",
            Some(json!({"key": "brief", "ttl": 2})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let status = call(proxy, "GET", "/t", &[("apikey", "brief")])
        .await
        .status;
    if written.elapsed() < std::time::Duration::from_millis(1500) {
        assert_eq!(status, 200);
    }
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert_eq!(
        call(proxy, "GET", "/t", &[("apikey", "brief")])
            .await
            .status,
        401
    );
    assert_eq!(gw.admin("GET", "/key-auths/brief", None).await.status, 404);
}

/// CORS on the Admin API: with `admin_gui_url` unset, a page from any origin gets `*` and no
/// credentials (its browser sends none of the operator's), this node's own Kong Manager its
/// origin with credentials; with `admin_gui_url` set, that origin, as Kong answers.
#[tokio::test]
async fn admin_api_cors_gives_no_credentials_to_other_pages() {
    let gui_port = free_port();
    let gw = Gateway::sqlite()
        .env(
            "TURNPIKE_ADMIN_GUI_LISTEN",
            &format!("127.0.0.1:{gui_port}"),
        )
        .start();
    let own = format!("http://127.0.0.1:{gui_port}");
    let own_by_name = format!("http://localhost:{gui_port}");
    for method in ["GET", "OPTIONS"] {
        for evil in [
            "http://evil.example",
            "http://127.0.0.1:1",
            "https://127.0.0.1",
        ] {
            let r = call(gw.admin, method, "/", &[("origin", evil)]).await;
            assert_eq!(
                r.header("access-control-allow-origin"),
                Some("*"),
                "{method} {evil}"
            );
            assert_eq!(
                r.header("access-control-allow-credentials"),
                None,
                "{method} {evil}"
            );
        }
        for mine in [&own, &own_by_name] {
            let r = call(gw.admin, method, "/", &[("origin", mine)]).await;
            assert_eq!(r.header("access-control-allow-origin"), Some(mine.as_str()));
            assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
            assert_eq!(r.header("vary"), Some("Origin"));
        }
        let r = call(gw.admin, method, "/", &[]).await;
        assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    }
    drop(gw);
    let gw = Gateway::sqlite()
        .env("TURNPIKE_ADMIN_GUI_URL", "https://manager.example.com/path")
        .start();
    let r = call(gw.admin, "GET", "/", &[("origin", "http://evil.example")]).await;
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://manager.example.com")
    );
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
}

/// `turnpike vault get` (Kong's `kong vault get`): a reference resolved with the node's
/// vaults, from its declarative file or its database, and the env vault's `prefix` and
/// `base64_decode`.
#[tokio::test]
async fn vault_get_resolves_references_as_the_node_would() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "kong.yml",
        "_format_version: '3.0'\nvaults:\n- prefix: b64\n  name: env\n  config: {prefix: TPV_, base64_decode: true}\n",
    );
    let creds = "eyJ1c2VyIjogImFkbWluIn0="; // {"user": "admin"}
    let env = [
        ("TURNPIKE_DECLARATIVE_CONFIG", file.to_str().unwrap()),
        ("TPV_CREDS", creds),
        ("PLAIN_SECRET", "s3cret"),
    ];
    let (ok, out) = run(&["vault", "get", "{vault://b64/creds/user}"], &env);
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "admin");
    let (ok, out) = run(&["vault", "get", "env/plain-secret"], &env);
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "s3cret");
    let (ok, out) = run(&["vault", "get", "env/missing"], &env);
    assert!(!ok);
    assert!(out.contains("MISSING is not set"), "{out}");
    // On a database node, its vaults entities.
    let gw = Gateway::sqlite().start();
    let r = gw
        .admin(
            "POST",
            "/vaults",
            Some(json!({"prefix": "db", "name": "env", "config": {"prefix": "TPV_", "base64_decode": true}})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.json()["config"]["base64_decode"], true);
    let prefix = gw.dir.path().join("prefix");
    let (ok, out) = run(
        &["vault", "get", "{vault://db/creds/user}"],
        &[
            ("TURNPIKE_DATABASE", "sqlite"),
            ("TURNPIKE_PREFIX", prefix.to_str().unwrap()),
            ("TPV_CREDS", creds),
        ],
    );
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "admin");
}
