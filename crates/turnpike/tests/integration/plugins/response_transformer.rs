//! The header_filter and body_filter phases, through response-transformer: the upstream's
//! headers and JSON body changed on their way to the client (Kong's own headers included), the
//! same on a response a plugin produced, other routes untouched, and bad configs refused in
//! Kong's shape.

use crate::common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_are_transformed_on_their_way_to_the_client() {
    let up = Upstream::start("rt");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: transformed
    paths: [/t]
    plugins:
    - name: response-transformer
      config:
        remove: {{headers: [x-upstream, via], json: [headers]}}
        rename: {{headers: ["x-kong-upstream-latency:x-upstream-took"], json: ["method:verb"]}}
        replace: {{headers: ["content-type:application/json; charset=utf-8"], json: ["body_len:-1"], json_types: [number]}}
        add: {{headers: ["x-added:yes"], json: ["added:true"], json_types: [boolean]}}
        append: {{headers: ["x-multi:one", "x-multi:two"], json: ["upstream:extra"]}}
  - name: terminated
    paths: [/stop]
    plugins:
    - name: request-termination
      config: {{status_code: 403, message: "closed"}}
    - name: response-transformer
      config:
        add: {{headers: ["x-added:on-exit"], json: ["why:maintenance"]}}
  - name: plain
    paths: [/plain]
"#,
        url = up.url()
    ))
    .start();

    // Headers: removed (the upstream's and Kong's Via), renamed (Kong's latency header),
    // replaced, added, appended; the JSON body rewritten, sent chunked (the upstream's
    // Content-Length no longer holds).
    let r = call(gw.proxy, "GET", "/t/sized", &[]).await;
    assert_eq!(r.status, 200);
    assert!(r.header("x-upstream").is_none(), "{:?}", r.headers);
    assert!(r.header("via").is_none(), "{:?}", r.headers);
    assert!(r.header("x-kong-upstream-latency").is_none());
    assert!(r.header("x-upstream-took").is_some(), "{:?}", r.headers);
    assert_eq!(
        r.header("content-type"),
        Some("application/json; charset=utf-8")
    );
    assert_eq!(r.header("x-added"), Some("yes"));
    let multi: Vec<_> = r.headers.get_all("x-multi").iter().collect();
    assert_eq!(multi, ["one", "two"]);
    assert!(r.header("content-length").is_none(), "{:?}", r.headers);
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    let body = r.json();
    assert!(body.get("headers").is_none(), "{body}");
    assert!(body.get("method").is_none(), "{body}");
    assert_eq!(body["verb"], "GET");
    assert_eq!(body["body_len"], -1);
    assert_eq!(body["added"], true);
    assert_eq!(body["upstream"], json!(["rt", "extra"]));
    assert_eq!(body["uri"], "/sized");

    // A response a plugin produced goes through the phase too.
    let r = call(gw.proxy, "GET", "/stop", &[]).await;
    assert_eq!(r.status, 403);
    assert_eq!(r.header("x-added"), Some("on-exit"));
    assert_eq!(r.json(), json!({"message": "closed", "why": "maintenance"}));

    // A route without the plugin keeps the upstream's response as it was.
    let r = call(gw.proxy, "GET", "/plain/sized", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-upstream"), Some("rt"));
    assert!(r.header("via").is_some());
    let length = r
        .header("content-length")
        .map(|l| l.parse::<usize>().unwrap());
    assert_eq!(length, Some(r.body.len()), "{:?}", r.headers);
    assert!(r.json().get("headers").is_some());

    // HEAD: the head is transformed, no body is sent.
    let r = call(gw.proxy, "HEAD", "/t/sized", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-added"), Some("yes"));
    assert!(r.body.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_response_transformer_configs_are_refused() {
    let gw = Gateway::sqlite().start();
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(json!({"name": "response-transformer", "config": {
                "add": {"headers": ["x-ok:1", "no-colon"], "json_types": ["date"]},
                "remove": {"headers": "not-an-array"},
            }})),
        )
        .await;
    assert_eq!(r.status, 400, "{:?}", r.body);
    let body = r.json();
    assert_eq!(body["name"], "schema violation");
    let config = &body["fields"]["config"];
    assert_eq!(
        config["add"]["headers"][1], "invalid value: no-colon",
        "{body}"
    );
    assert_eq!(
        config["add"]["json_types"][0],
        "expected one of: boolean, number, string"
    );
    assert_eq!(config["remove"]["headers"], "expected an array");
    // Nothing was stored.
    assert_eq!(
        gw.admin("GET", "/plugins", None).await.json()["data"],
        json!([])
    );

    // The stored config carries every default, as Kong's does.
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(
                json!({"name": "response-transformer", "config": {"add": {"headers": ["x-a:1"]}}}),
            ),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let config = &r.json()["config"];
    assert_eq!(
        config["add"],
        json!({"headers": ["x-a:1"], "json": [], "json_types": []})
    );
    assert_eq!(config["rename"], json!({"headers": [], "json": []}));
    let schema = gw
        .admin("GET", "/schemas/plugins/response-transformer", None)
        .await;
    assert_eq!(schema.status, 200);
}
