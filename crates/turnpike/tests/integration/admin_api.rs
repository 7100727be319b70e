//! The Admin API against the real binary on its embedded SQLite store: entity families, Kong's
//! error shapes, paging and tags, decK's call sequence, persistence, import/export, DB-less
//! behaviour and the admin token.

use crate::common::*;
use std::time::Duration;

use serde_json::{json, Value};

fn ids(list: &Value) -> Vec<String> {
    list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn services_and_routes_crud_proxy_at_once() {
    let up = Upstream::start("up");
    let gw = Gateway::sqlite().start();
    let r = gw
        .admin(
            "POST",
            "/services",
            Some(json!({"name": "orders", "url": up.url()})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let svc = r.json();
    assert_eq!(svc["retries"], 5);
    assert_eq!(svc["connect_timeout"], 60000);
    let sid = svc["id"].as_str().unwrap().to_string();

    // Form-encoded, nested under the service, as Kong's docs show it.
    let r = admin_raw(
        gw.admin,
        "POST",
        "/services/orders/routes",
        "application/x-www-form-urlencoded",
        b"name=r1&paths[]=/orders&strip_path=false".to_vec(),
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let route = r.json();
    assert_eq!(route["service"]["id"], sid);
    assert_eq!(route["strip_path"], false);
    assert_eq!(route["paths"], json!(["/orders"]));

    // The Admin API answered: this node already routes it.
    let p = until_status(gw.proxy, "/orders/1", 200).await;
    assert_eq!(p.status, 200, "{:?}", p.body);
    assert_eq!(p.header("x-upstream"), Some("up"));

    // By id and by endpoint key; nested and parent look-ups.
    assert_eq!(
        gw.admin("GET", &format!("/services/{sid}"), None)
            .await
            .json()["name"],
        "orders"
    );
    assert_eq!(
        gw.admin("GET", "/routes/r1/service", None).await.json()["id"],
        sid
    );
    assert_eq!(
        ids(&gw
            .admin("GET", "/services/orders/routes", None)
            .await
            .json())
        .len(),
        1
    );

    // PATCH merges; the change is live.
    let r = gw
        .admin("PATCH", "/routes/r1", Some(json!({"paths": ["/o2"]})))
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["strip_path"], false);
    assert_eq!(until_status(gw.proxy, "/o2", 200).await.status, 200);
    assert_eq!(until_status(gw.proxy, "/orders", 404).await.status, 404);

    // PUT by endpoint key creates.
    let r = gw
        .admin(
            "PUT",
            "/services/billing",
            Some(json!({"host": "127.0.0.1", "port": up.addr.port()})),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["name"], "billing");

    // A service with routes cannot be deleted; the route then the service can.
    let r = gw.admin("DELETE", "/services/orders", None).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["fields"]["@referenced_by"], "routes");
    assert_eq!(gw.admin("DELETE", "/routes/r1", None).await.status, 204);
    assert_eq!(until_status(gw.proxy, "/o2", 404).await.status, 404);
    assert_eq!(
        gw.admin("DELETE", "/services/orders", None).await.status,
        204
    );
    assert_eq!(gw.admin("GET", "/services/orders", None).await.status, 404);
    assert_eq!(
        gw.admin("GET", "/services/orders", None).await.json(),
        json!({"message": "Not found"})
    );
}

#[tokio::test]
async fn bad_input_gets_kong_errors_and_changes_nothing() {
    let gw = Gateway::sqlite().start();
    let count = |v: Value| v["data"].as_array().unwrap().len();
    assert_eq!(
        gw.admin("POST", "/services", Some(json!({"name": "a", "host": "h"})))
            .await
            .status,
        201
    );

    let r = gw
        .admin("POST", "/services", Some(json!({"name": "b"})))
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json(),
        json!({"code": 2, "name": "schema violation", "message": "schema violation (host: required field missing)", "fields": {"host": "required field missing"}})
    );
    let r = gw
        .admin(
            "POST",
            "/services",
            Some(json!({"host": "h", "port": "eighty", "colour": "red"})),
        )
        .await;
    assert_eq!(r.status, 400);
    let body = r.json();
    assert_eq!(body["fields"]["colour"], "unknown field");
    assert!(body["fields"]["port"].is_string());
    assert!(body["message"]
        .as_str()
        .unwrap()
        .starts_with("2 schema violations"));

    let r = gw
        .admin("POST", "/services", Some(json!({"name": "a", "host": "h"})))
        .await;
    assert_eq!(r.status, 409);
    assert_eq!(r.json()["name"], "unique constraint violation");

    let r = gw
        .admin(
            "POST",
            "/routes",
            Some(
                json!({"paths": ["/x"], "service": {"id": "9f3c2f0e-1111-4222-8333-444455556666"}}),
            ),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["name"], "foreign key violation");

    // SQL metacharacters are data, not SQL.
    let r = gw
        .admin(
            "POST",
            "/services",
            Some(json!({"name": "x'; DROP TABLE services;--", "host": "h"})),
        )
        .await;
    assert_eq!(r.status, 400);
    let r = gw
        .admin(
            "POST",
            "/consumers",
            Some(json!({"username": "o'brien\"; DELETE FROM consumers;--"})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(
        gw.admin(
            "GET",
            "/consumers/o'brien%22;%20DELETE%20FROM%20consumers;--",
            None
        )
        .await
        .status,
        200
    );

    let r = admin_raw(
        gw.admin,
        "POST",
        "/services",
        "application/json",
        b"{\"name\": ".to_vec(),
    )
    .await;
    assert_eq!(
        (r.status, r.json()["message"].clone()),
        (400, json!("Cannot parse JSON body"))
    );
    let r = admin_raw(
        gw.admin,
        "POST",
        "/services",
        "application/json",
        vec![b'{', 0xff, 0xfe, b'}'],
    )
    .await;
    assert_eq!(r.status, 400);
    let r = admin_raw(
        gw.admin,
        "POST",
        "/services",
        "application/json",
        b"[1,2]".to_vec(),
    )
    .await;
    assert_eq!(r.status, 400);
    let huge = format!("{{\"name\": \"{}\"}}", "a".repeat(2 * 1024 * 1024));
    let r = admin_raw(
        gw.admin,
        "POST",
        "/services",
        "application/json",
        huge.into_bytes(),
    )
    .await;
    assert_eq!(r.status, 413);
    let r = gw.admin("GET", "/services?size=0", None).await;
    assert_eq!(
        (r.status, r.json()["name"].clone()),
        (400, json!("invalid size"))
    );
    let r = gw.admin("GET", "/services?size=abc", None).await;
    assert_eq!(r.status, 400);
    let r = gw.admin("GET", "/services?offset=!!!", None).await;
    assert_eq!(
        (r.status, r.json()["name"].clone()),
        (400, json!("invalid offset"))
    );
    let r = gw.admin("GET", "/services?tags=", None).await;
    assert_eq!(
        (r.status, r.json()["name"].clone()),
        (400, json!("invalid options"))
    );
    assert_eq!(gw.admin("GET", "/nonsense", None).await.status, 404);

    assert_eq!(count(gw.admin("GET", "/services", None).await.json()), 1);
    assert_eq!(count(gw.admin("GET", "/consumers", None).await.json()), 1);
}

#[tokio::test]
async fn paging_and_tags() {
    let gw = Gateway::sqlite().start();
    for i in 0..7 {
        let tags = if i % 2 == 0 {
            json!(["even", "all"])
        } else {
            json!(["odd", "all"])
        };
        let r = gw
            .admin(
                "POST",
                "/services",
                Some(json!({"name": format!("s{i}"), "host": "h", "tags": tags})),
            )
            .await;
        assert_eq!(r.status, 201);
    }
    let mut seen = Vec::new();
    let mut path = "/services?size=3".to_string();
    loop {
        let page = gw.admin("GET", &path, None).await.json();
        assert!(page["data"].as_array().unwrap().len() <= 3);
        seen.extend(ids(&page));
        match page["offset"].as_str() {
            Some(_) => path = page["next"].as_str().unwrap().to_string(),
            None => {
                assert!(page["next"].is_null());
                break;
            }
        }
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 7);

    assert_eq!(
        ids(&gw
            .admin("GET", "/services?tags=even,all", None)
            .await
            .json())
        .len(),
        4
    );
    assert_eq!(
        ids(&gw
            .admin("GET", "/services?tags=even,odd", None)
            .await
            .json())
        .len(),
        0
    );
    assert_eq!(
        ids(&gw
            .admin("GET", "/services?tags=even/odd", None)
            .await
            .json())
        .len(),
        7
    );
    let t = gw.admin("GET", "/tags/odd", None).await.json();
    assert_eq!(t["data"].as_array().unwrap().len(), 3);
    assert_eq!(t["data"][0]["entity_name"], "services");
}

#[tokio::test]
async fn credentials_upstreams_targets_certificates() {
    let gw = Gateway::sqlite().start();
    let c = gw
        .admin("POST", "/consumers", Some(json!({"username": "alice"})))
        .await
        .json();
    let cid = c["id"].as_str().unwrap().to_string();
    let r = gw
        .admin(
            "POST",
            "/consumers/alice/key-auth",
            Some(json!({"key": "k-123"})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.json()["consumer"]["id"], cid);
    // A generated key when none is given.
    let r = gw.admin("POST", "/consumers/alice/key-auth", None).await;
    assert_eq!(r.status, 201);
    assert_eq!(r.json()["key"].as_str().unwrap().len(), 32);
    assert_eq!(
        ids(&gw.admin("GET", "/key-auths", None).await.json()).len(),
        2
    );
    assert_eq!(
        gw.admin("GET", "/key-auths/k-123", None).await.json()["consumer"]["id"],
        cid
    );
    assert_eq!(
        gw.admin(
            "POST",
            "/consumers/alice/key-auth",
            Some(json!({"key": "k-123"}))
        )
        .await
        .status,
        409
    );
    assert_eq!(
        gw.admin(
            "POST",
            "/consumers/nobody/key-auth",
            Some(json!({"key": "x"}))
        )
        .await
        .status,
        404
    );

    let u = gw
        .admin("POST", "/upstreams", Some(json!({"name": "backend"})))
        .await;
    assert_eq!(u.status, 201, "{:?}", u.body);
    assert_eq!(u.json()["slots"], 10000);
    let t = gw
        .admin(
            "POST",
            "/upstreams/backend/targets",
            Some(json!({"target": "10.0.0.1:8080"})),
        )
        .await;
    assert_eq!(t.status, 201, "{:?}", t.body);
    assert_eq!(t.json()["weight"], 100);
    assert_eq!(
        gw.admin("GET", "/upstreams/backend/targets/10.0.0.1:8080", None)
            .await
            .status,
        200
    );
    assert_eq!(
        gw.admin(
            "POST",
            "/upstreams/backend/targets",
            Some(json!({"target": "10.0.0.1:8080"}))
        )
        .await
        .status,
        409
    );

    let (cert, key) = cert_for("api.example.com");
    let r = gw
        .admin(
            "POST",
            "/certificates",
            Some(json!({"cert": cert, "key": key, "snis": ["api.example.com"]})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let cert_id = r.json()["id"].as_str().unwrap().to_string();
    assert_eq!(
        gw.admin("GET", "/snis/api.example.com", None).await.json()["certificate"]["id"],
        cert_id
    );
    assert_eq!(
        gw.admin("GET", &format!("/certificates/{cert_id}"), None)
            .await
            .json()["snis"],
        json!(["api.example.com"])
    );
    // Served on TLS as soon as the node has applied the write.
    let tls = gw.proxy_tls;
    assert!(
        eventually(Duration::from_secs(10), async || {
            let (reply, served, _) = get_tls(tls, "api.example.com", "/", false).await;
            reply.status == 404 && served.windows(15).any(|w| w == b"api.example.com")
        })
        .await,
        "{}",
        gw.log_text()
    );

    // Deleting the consumer takes its credentials; the upstream its targets.
    assert_eq!(
        gw.admin("DELETE", "/consumers/alice", None).await.status,
        204
    );
    assert_eq!(
        ids(&gw.admin("GET", "/key-auths", None).await.json()).len(),
        0
    );
    assert_eq!(
        gw.admin("DELETE", "/upstreams/backend", None).await.status,
        204
    );
    assert_eq!(
        ids(&gw.admin("GET", "/targets", None).await.json()).len(),
        0
    );
}

/// The calls decK makes for `gateway ping`, `dump` and `sync` (kong-compat.md §3).
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
async fn config_survives_restart_and_round_trips_through_import_export() {
    let up = Upstream::start("persist");
    let prefix = tempfile::tempdir().unwrap();
    let prefix_env = prefix.path().join("p");
    let prefix_s = prefix_env.to_str().unwrap();
    {
        let gw = Gateway::sqlite().env("TURNPIKE_PREFIX", prefix_s).start();
        gw.add_service_route(&up.url(), "/keep").await;
    }
    let gw = Gateway::sqlite().env("TURNPIKE_PREFIX", prefix_s).start();
    assert_eq!(get(gw.proxy, "x", "/keep").await.status, 200);
    drop(gw);

    let env = [
        ("TURNPIKE_PREFIX", prefix_s),
        ("TURNPIKE_DATABASE", "sqlite"),
    ];
    let out = prefix.path().join("export.yml");
    let (ok, text) = run(&["config", "db_export", out.to_str().unwrap()], &env);
    assert!(ok, "{text}");
    let exported = std::fs::read_to_string(&out).unwrap();
    assert!(exported.contains("- /keep"), "not YAML: {exported}");
    assert!(exported.starts_with("_format_version: '3.0'"), "{exported}");

    let other = prefix.path().join("q");
    let env2 = [
        ("TURNPIKE_PREFIX", other.to_str().unwrap()),
        ("TURNPIKE_DATABASE", "sqlite"),
    ];
    let (ok, text) = run(&["config", "db_import", out.to_str().unwrap()], &env2);
    assert!(ok, "{text}");
    let gw = Gateway::sqlite()
        .env("TURNPIKE_PREFIX", other.to_str().unwrap())
        .start();
    assert_eq!(get(gw.proxy, "x", "/keep").await.status, 200);
    // A bad file is refused whole.
    let bad = write(
        prefix.path(),
        "bad.yml",
        "_format_version: '3.0'\nservices:\n- name: ok\n  host: h\n- name: broken\n",
    );
    let (ok, text) = run(&["config", "db_import", bad.to_str().unwrap()], &env2);
    assert!(!ok);
    assert!(text.contains("host"), "{text}");
    let (ok, text) = run(&["migrations", "status"], &env2);
    assert!(ok && text.contains("up to date"), "{text}");
}

#[tokio::test]
async fn dbless_reads_config_and_refuses_writes() {
    let gw = Gateway::with_config(
        "_format_version: '3.0'\nservices:\n- name: a\n  host: h\n  tags: [x]\n  routes:\n  - name: ra\n    paths: [/a]\n",
    )
    .start();
    let r = gw.admin("GET", "/services", None).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["data"][0]["name"], "a");
    assert_eq!(
        gw.admin("GET", "/services/a/routes", None).await.json()["data"][0]["name"],
        "ra"
    );
    assert_eq!(
        gw.admin("GET", "/routes/ra/service", None).await.json()["name"],
        "a"
    );
    assert_eq!(
        ids(&gw.admin("GET", "/services?tags=x", None).await.json()).len(),
        1
    );
    let r = gw
        .admin("POST", "/services", Some(json!({"host": "h"})))
        .await;
    assert_eq!(r.status, 405);
}

#[tokio::test]
async fn admin_token_guards_a_public_listener() {
    let port = free_port();
    // Refused without a token.
    let (ok, text) = run(
        &["start"],
        &[
            ("TURNPIKE_ADMIN_LISTEN", &format!("0.0.0.0:{port}")),
            ("TURNPIKE_DATABASE", "off"),
            ("TURNPIKE_PREFIX", "/tmp/turnpike-token-test"),
        ],
    );
    assert!(!ok);
    assert!(text.contains("admin_auth_token"), "{text}");

    let gw = Gateway::sqlite()
        .env("TURNPIKE_ADMIN_AUTH_TOKEN", "s3cret-token")
        .start();
    assert_eq!(gw.admin("GET", "/services", None).await.status, 401);
    let r = send(
        gw.admin,
        req("GET", "/services")
            .header("authorization", "Bearer s3cret-token")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 200);
    let r = send(
        gw.admin,
        req("GET", "/")
            .header("authorization", "Bearer s3cret-token")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await;
    assert!(!String::from_utf8_lossy(&r.body).contains("s3cret-token"));
}

/// decK writes with parallelism 10: concurrent writes to the embedded store all land (SQLite
/// serialises writers; none may fail with a busy/locked database error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_on_sqlite_all_land() {
    let gw = Gateway::sqlite().start();
    let admin = gw.admin;
    let mut tasks = Vec::new();
    for i in 0..40 {
        tasks.push(tokio::spawn(async move {
            let r = admin_call(
                admin,
                "PUT",
                &format!("/services/s{i}"),
                Some(json!({"host": "127.0.0.1", "port": 9})),
            )
            .await;
            let r2 = admin_call(
                admin,
                "POST",
                &format!("/services/s{i}/routes"),
                Some(json!({"paths": [format!("/c{i}")]})),
            )
            .await;
            (r.status, r2.status)
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), (200, 201));
    }
    let page = gw.admin("GET", "/routes?size=1000", None).await.json();
    assert_eq!(page["data"].as_array().unwrap().len(), 40);
    // Routed (to a closed port: 502), so the node applied all of them.
    assert_eq!(until_status(gw.proxy, "/c39", 502).await.status, 502);
}

/// Admin API behaviours Kong's own clients rely on (issue #21 item 4), each seen differing
/// from Kong before: filters, ACLs by group, ttl, health right after a write, target
/// timestamps, and validation as strict as Kong's.
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
