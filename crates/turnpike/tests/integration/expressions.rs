//! `router_flavor = expressions` end to end through the real binary: expression routes from a
//! declarative file and through the Admin API, every kind of field they read, priorities,
//! strip_path and regex captures reaching a plugin, Kong's validation messages for bad
//! expressions (hostile sizes included) with the rest of the config still serving, and the
//! other flavors refusing the fields.

use crate::common::*;
use bytes::Bytes;
use http_body_util::Full;
use serde_json::json;

fn config(u1: &Upstream, u2: &Upstream) -> String {
    format!(
        r##"
_format_version: "3.0"
services:
  - name: one
    url: {u1}/svc
    routes:
      - name: users
        expression: 'http.path ~ r#"^/users/(?P<id>\d+)"# && http.method == "GET"'
        plugins:
          - name: request-transformer
            config: {{add: {{headers: ["x-user:$(uri_captures.id)"]}}}}
      - name: query
        expression: 'http.path ^= "/q" && http.queries.v == "2"'
        priority: 5
      - name: header-lower
        expression: 'http.path ^= "/q" && lower(http.headers.x_team) == "blue"'
        priority: 10
        strip_path: false
      - name: segments
        expression: 'http.path.segments.0 == "seg" && http.path.segments.len == 3'
        strip_path: false
      - name: traditional
        paths: [/trad]
      - name: host-case
        expression: 'http.host == "Case.test"'
  - name: two
    url: {u2}
    routes:
      - name: not-local
        expression: 'http.path ^= "/src" && net.src.ip in 10.0.0.0/8'
      - name: local
        expression: 'http.path ^= "/src" && net.src.ip == 127.0.0.1 && net.dst.port == 8000'
"##,
        u1 = u1.url(),
        u2 = u2.url(),
    )
}

async fn get_with(p: std::net::SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    call(p, "GET", path, headers).await
}

#[tokio::test(flavor = "multi_thread")]
async fn expression_routes_from_a_declarative_file() {
    let u1 = Upstream::start("one");
    let u2 = Upstream::start("two");
    // `net.dst.port` is the Host's port when it has one: the requests name 8000.
    let yaml = config(&u1, &u2);
    let gw = Gateway::with_config(&yaml)
        .env("TURNPIKE_ROUTER_FLAVOR", "expressions")
        .start();
    let p = gw.proxy;

    // A regex with a named group: strip_path strips what it matched, the capture reaches
    // request-transformer.
    let r = get(p, "localhost", "/users/42/profile").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let j = r.json();
    assert_eq!(j["uri"], "/svc/profile");
    assert_eq!(j["headers"]["x-user"], "42");
    let r = send(
        p,
        req("POST", "/users/42")
            .body(Full::new(Bytes::from("x")))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 404, "{:?}", r.body);

    // Queries and headers; the higher priority first (header-lower keeps its path).
    assert_eq!(
        get(p, "localhost", "/q?v=2").await.json()["uri"],
        "/svc?v=2"
    );
    let r = get_with(p, "/q?v=2", &[("x-team", "BLUE")]).await;
    assert_eq!(r.json()["uri"], "/svc/q?v=2");
    let r = get_with(p, "/q", &[("x-team", "Blue")]).await;
    assert_eq!(r.json()["uri"], "/svc/q");
    assert_eq!(get(p, "localhost", "/q?v=3").await.status, 404);

    // Path segments.
    assert_eq!(
        get(p, "localhost", "/seg/a/b").await.json()["uri"],
        "/svc/seg/a/b"
    );
    assert_eq!(get(p, "localhost", "/seg/a").await.status, 404);
    assert_eq!(get(p, "localhost", "/seg/a/b/c").await.status, 404);

    // A traditional route beside the expression ones.
    assert_eq!(get(p, "localhost", "/trad/x").await.json()["uri"], "/svc/x");

    // http.host keeps the case the client sent, as in Kong.
    assert_eq!(get(p, "Case.test", "/").await.status, 200);
    assert_eq!(get(p, "case.test", "/").await.status, 404);

    // net.src.ip, and net.dst.port from the Host's port.
    let r = get(p, "localhost:8000", "/src").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["upstream"], "two");
    assert_eq!(get(p, "localhost:8001", "/src").await.status, 404);

    // The node says which flavor it runs; the route schema has the flavor's fields.
    let root = gw.admin("GET", "/", None).await.json();
    assert_eq!(root["configuration"]["router_flavor"], "expressions");
    let schema = gw.admin("GET", "/schemas/routes", None).await.json();
    let fields: Vec<String> = schema["fields"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|f| f.as_object().unwrap().keys().cloned())
        .collect();
    assert!(fields.contains(&"expression".to_string()), "{fields:?}");
    assert!(fields.contains(&"priority".to_string()), "{fields:?}");
    let priority = schema["fields"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|f| f.get("priority"))
        .unwrap();
    assert_eq!(priority["type"], "integer");
    assert_eq!(priority["between"], json!([0, 70368744177663i64]));
}

fn violation(r: &Reply) -> String {
    assert_eq!(r.status, 400, "{:?}", String::from_utf8_lossy(&r.body));
    let j = r.json();
    assert_eq!(j["name"], "schema violation", "{j}");
    j["fields"]["@entity"][0]
        .as_str()
        .unwrap_or_else(|| panic!("{j}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn expression_routes_through_the_admin_api() {
    let up = Upstream::start("admin-exp");
    let gw = Gateway::sqlite()
        .env("KONG_ROUTER_FLAVOR", "expressions")
        .start();
    let r = gw
        .admin(
            "POST",
            "/services",
            Some(json!({"name": "s", "url": up.url()})),
        )
        .await;
    assert_eq!(r.status, 201);
    let r = gw
        .admin(
            "POST",
            "/services/s/routes",
            Some(json!({"name": "e", "expression": "http.path ^= \"/e\" && http.method == \"GET\"", "priority": 3})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", String::from_utf8_lossy(&r.body));
    let j = r.json();
    assert_eq!(
        j["expression"],
        "http.path ^= \"/e\" && http.method == \"GET\""
    );
    assert_eq!(j["priority"], 3);
    let id = j["id"].as_str().unwrap().to_string();
    // A traditional route shows the flavor's fields too, null and 0.
    let r = gw
        .admin(
            "POST",
            "/services/s/routes",
            Some(json!({"name": "t", "paths": ["/t"]})),
        )
        .await;
    assert_eq!(r.status, 201);
    assert_eq!(r.json()["expression"], serde_json::Value::Null);
    assert_eq!(r.json()["priority"], 0);
    let r = until_status(gw.proxy, "/e/x", 200).await;
    assert_eq!(r.json()["uri"], "/x");

    // Kong's messages, under "@entity", for what its validate_route refuses.
    let post = |body: serde_json::Value| {
        let gw = &gw;
        async move { gw.admin("POST", "/services/s/routes", Some(body)).await }
    };
    let e = violation(&post(json!({"expression": "http.path = \"/a\""})).await);
    assert!(
        e.starts_with("Router Expression failed validation:  --> 1:11"),
        "{e}"
    );
    let e = violation(&post(json!({"expression": "http.nope == \"/a\""})).await);
    assert_eq!(e, "Router Expression failed validation: Unknown LHS field");
    let e = violation(&post(json!({"expression": "http.path ~ \"(\""})).await);
    assert!(e.contains("regex parse error"), "{e}");
    let e = violation(&post(json!({"expression": "http.path == 1"})).await);
    assert!(e.contains("Type mismatch"), "{e}");
    let e = violation(&post(json!({"expression": "http.path ^= \"/a\"", "paths": ["/a"]})).await);
    assert!(e.contains("cannot set 'expression' with"), "{e}");
    let r = post(json!({"expression": "http.path ^= \"/a\"", "priority": 70368744177664i64})).await;
    assert_eq!(r.status, 400, "{:?}", String::from_utf8_lossy(&r.body));
    assert!(r.json()["fields"]["priority"].is_string(), "{}", r.json());
    // Hostile sizes: 10,000 nested parentheses, a 1 MiB expression.
    let deep = format!(
        "{}http.path == \"/\"{}",
        "(".repeat(10_000),
        ")".repeat(10_000)
    );
    let e = violation(&post(json!({"expression": deep})).await);
    assert!(e.contains("nested deeper"), "{e}");
    let long = vec!["http.path == \"/\""; 70_000].join(" && ");
    assert!(long.len() > 1 << 20);
    let r = post(json!({"expression": long})).await;
    assert!(r.status == 400 || r.status == 413, "{}", r.status);
    // A PATCH that breaks the route is refused and the route keeps serving.
    let r = gw
        .admin(
            "PATCH",
            &format!("/routes/{id}"),
            Some(json!({"expression": "http.path =="})),
        )
        .await;
    violation(&r);
    let routes = gw.admin("GET", "/routes", None).await.json();
    assert_eq!(routes["data"].as_array().unwrap().len(), 2, "{routes}");
    assert_eq!(call(gw.proxy, "GET", "/e/y", &[]).await.status, 200);
    // The validate endpoint checks the same way.
    let r = gw
        .admin(
            "POST",
            "/schemas/routes/validate",
            Some(json!({"expression": "http.path ^^ \"/\""})),
        )
        .await;
    violation(&r);
    // A change to the expression is applied.
    let r = gw
        .admin(
            "PATCH",
            &format!("/routes/{id}"),
            Some(json!({"expression": "http.path ^= \"/f\""})),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    until_status(gw.proxy, "/f", 200).await;
    assert_eq!(call(gw.proxy, "GET", "/e/y", &[]).await.status, 404);
}

/// The fields exist only under the expressions flavor, as in Kong.
#[tokio::test(flavor = "multi_thread")]
async fn other_flavors_refuse_expression_fields() {
    let gw = Gateway::sqlite().start();
    let r = gw
        .admin(
            "POST",
            "/routes",
            Some(json!({"expression": "http.path ^= \"/a\""})),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["fields"]["expression"], "unknown field");
    let root = gw.admin("GET", "/", None).await.json();
    assert_eq!(
        root["configuration"]["router_flavor"],
        "traditional_compatible"
    );
}
