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
    // An X.509 version 1 certificate (no extensions: old self-signed ones, many internal CAs,
    // go-kong's own test certificates) is accepted as Kong accepts it, and served by SNI.
    let v1_cert = include_str!("../../../../turnpike-config/testdata/x509-v1-cert.pem");
    let v1_key = include_str!("../../../../turnpike-config/testdata/x509-v1-key.pem");
    let r = gw
        .admin(
            "POST",
            "/certificates",
            Some(json!({"cert": v1_cert, "key": v1_key, "snis": ["v1.example.test"]})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    // (rustls refuses to handshake with a v1 certificate even unverified; curl, on OpenSSL,
    // takes it as browsers and most clients do.)
    let resolve = format!("v1.example.test:{}:127.0.0.1", tls.port());
    let url = format!("https://v1.example.test:{}/", tls.port());
    assert!(
        eventually(Duration::from_secs(10), async || {
            let out = std::process::Command::new("curl")
                .args(["-skv", "-o", "/dev/null", "-w", "%{http_code}", "--resolve"])
                .args([&resolve, &url])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout) == "404"
                && String::from_utf8_lossy(&out.stderr).contains("CN=v1.example.test")
        })
        .await,
        "{}",
        gw.log_text()
    );
    // What is really unusable keeps a clear error in Kong's shape.
    let r = gw
        .admin(
            "POST",
            "/certificates",
            Some(json!({"cert": v1_cert, "key": key})),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["fields"],
        json!({"@entity": ["certificate does not match key"]})
    );
    let r = gw
        .admin(
            "POST",
            "/certificates",
            Some(json!({"cert": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "key": v1_key})),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["fields"],
        json!({"cert": "invalid certificate: not a well-formed X.509 certificate"})
    );
    let r = gw
        .admin("POST", "/ca_certificates", Some(json!({"cert": v1_cert})))
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["message"],
        "schema violation (@entity: certificate does not appear to be a CA because it is missing the \"CA\" basic constraint)"
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
mod clients;

/// `config db_import` into an empty store writes in bulk (many entities to a statement) what
/// entity-by-entity writes would: every kind the file holds, credentials as they are stored
/// (a basic-auth password hashed), tags, a certificate's snis; no change-log entries, and a
/// node already running on the store reads it whole for that gap and serves it. Into a store
/// that has rows, the same file is imported entity by entity (an update of what is there).
#[tokio::test]
async fn db_import_in_bulk_writes_what_writes_would() {
    let up = Upstream::start("bulk");
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("p");
    let (cert, key) = cert_for("bulk.example");
    let mut yaml = format!(
        "_format_version: '3.0'\nservices:\n- name: main\n  url: {}\n  tags: [team-a]\n  routes:\n  - name: main\n    paths: [/bulk]\n    plugins:\n    - name: key-auth\n",
        up.url()
    );
    for i in 0..1500 {
        yaml.push_str(&format!(
            "- name: s{i}\n  host: h{i}.example\n  tags: [generated]\n  routes:\n  - paths: [/r{i}]\n"
        ));
    }
    yaml.push_str("consumers:\n- username: alice\n  keyauth_credentials:\n  - id: 4a1b5e30-0000-4000-8000-000000000001\n    key: alice-key\n  basicauth_credentials:\n  - id: 4a1b5e30-0000-4000-8000-000000000002\n    username: alice\n    password: s3cret\n");
    for i in 0..3000 {
        yaml.push_str(&format!("- username: u{i}\n  custom_id: c{i}\n"));
    }
    yaml.push_str(&format!(
        "upstreams:\n- name: pool\n  targets:\n  - target: 127.0.0.1:9\ncertificates:\n- cert: |\n{}  key: |\n{}  snis: [bulk.example]\n",
        indent(&cert),
        indent(&key)
    ));
    let file = write(dir.path(), "kong.yml", &yaml);
    let env = [
        ("TURNPIKE_PREFIX", prefix.to_str().unwrap()),
        ("TURNPIKE_DATABASE", "sqlite"),
    ];
    // A node running on the (empty) store before the import.
    let gw = Gateway::sqlite()
        .env("TURNPIKE_PREFIX", prefix.to_str().unwrap())
        .start();
    assert_eq!(get(gw.proxy, "x", "/bulk").await.status, 404);
    let (ok, text) = run(&["config", "db_import", file.to_str().unwrap()], &env);
    assert!(ok, "{text}");
    // 1501 services and routes, 3001 consumers, 2 credentials, a plugin, an upstream, a
    // target, a certificate and its sni.
    assert!(text.contains("import successful: 6010 entities"), "{text}");
    let db = prefix.join("turnpike.db");
    let sql = |q: &str| {
        let out = std::process::Command::new("sqlite3")
            .arg(&db)
            .arg(q)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(sql("SELECT count(*) FROM services"), "1501");
    assert_eq!(sql("SELECT count(*) FROM consumers"), "3001");
    assert_eq!(
        sql("SELECT count(*) FROM tags WHERE tag = 'generated'"),
        "1500"
    );
    assert_eq!(sql("SELECT count(*) FROM snis"), "1");
    // The import's version has no change-log entries (a gap every node reads whole).
    let version = sql("SELECT value FROM turnpike_meta WHERE name = 'config_version'");
    assert_eq!(
        sql(&format!(
            "SELECT count(*) FROM changes WHERE version = {version}"
        )),
        "0"
    );
    let password = sql("SELECT json_extract(entity, '$.password') FROM basicauth_credentials");
    assert!(
        password.starts_with("$argon2") || password.len() == 40,
        "stored hashed: {password}"
    );

    assert_eq!(until_status(gw.proxy, "/bulk", 401).await.status, 401);
    assert_eq!(
        call(gw.proxy, "GET", "/bulk", &[("apikey", "alice-key")])
            .await
            .status,
        200
    );
    let tagged = gw.admin("GET", "/services?tags=team-a", None).await.json();
    assert_eq!(ids(&tagged).len(), 1, "{tagged}");
    assert_eq!(
        gw.admin("GET", "/consumers/u2999", None).await.json()["custom_id"],
        "c2999"
    );
    assert_eq!(
        gw.admin("GET", "/snis/bulk.example", None).await.status,
        200
    );
    drop(gw);
    // A second import of the same file updates what is there, entity by entity.
    let (ok, text) = run(&["config", "db_import", file.to_str().unwrap()], &env);
    assert!(ok, "{text}");
    assert_eq!(sql("SELECT count(*) FROM services"), "1501");
    assert_eq!(
        sql("SELECT count(*) FROM tags WHERE tag = 'generated'"),
        "1500"
    );
}

fn indent(pem: &str) -> String {
    pem.lines().map(|l| format!("    {l}\n")).collect()
}
