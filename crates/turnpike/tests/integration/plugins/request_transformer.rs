//! request-transformer on the real binary: headers, querystring, JSON, form and multipart bodies, the
//! method and the upstream path changed on their way to the upstream, in Kong's order, with
//! templates read from the request as it arrived; bad configs refused in Kong's shape.

use crate::common::*;
use serde_json::json;

/// The echo upstream's checksum of a body.
fn sum(body: &[u8]) -> u64 {
    body.iter()
        .fold(0u64, |a, b| a.wrapping_mul(31).wrapping_add(*b as u64))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_transformed_on_their_way_to_the_upstream() {
    let up = Upstream::start("reqt");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: users
    paths: ["~/users/(?<id>[a-z0-9]+)$"]
    plugins:
    - name: request-transformer
      config:
        remove: {{headers: [x-remove], querystring: [drop]}}
        rename: {{headers: ["x-old:x-new"], querystring: ["q:query"]}}
        replace: {{headers: ["x-rep:replaced", "x-absent:never"], uri: "/v2/$(uri_captures.id)"}}
        add: {{headers: ["x-user:$(uri_captures.id)", "x-from-query:$(query_params.q)", "x-exists:no", "x-old-was:$(headers.x_old)"], querystring: ["added:$(headers['x-old'] or 'none')"]}}
        append: {{headers: ["x-app:two"]}}
  - name: json
    paths: [/json]
    plugins:
    - name: request-transformer
      config:
        remove: {{body: [secret]}}
        rename: {{body: ["a:b"]}}
        add: {{body: ["new:$(headers.x_v)"]}}
        append: {{body: ["list:z"]}}
  - name: multipart
    paths: [/multipart]
    plugins:
    - name: request-transformer
      config:
        remove: {{body: [secret]}}
        rename: {{body: ["a:b"]}}
        replace: {{body: ["r:R", "absent:never"]}}
        add: {{body: ["new:$(headers.x_v)", "list:not-added"]}}
        append: {{body: ["list:z"]}}
  - name: form
    paths: [/form]
    plugins:
    - name: request-transformer
      config:
        http_method: GET
  - name: plain
    paths: [/plain]
"#,
        url = up.url()
    ))
    .start();
    let p = gw.proxy;

    let r = call(
        p,
        "GET",
        "/users/bob?q=hello&drop=1&keep=k",
        &[
            ("x-remove", "1"),
            ("x-old", "o"),
            ("x-rep", "r"),
            ("x-exists", "yes"),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let seen = r.json();
    // replace.uri, then the querystring: sorted, as Kong encodes it.
    assert_eq!(seen["uri"], "/v2/bob?added=o&keep=k&query=hello");
    let h = &seen["headers"];
    for (name, want) in [
        ("x-remove", json!(null)),
        ("x-old", json!(null)),
        ("x-new", json!("o")),
        ("x-rep", json!("replaced")),
        ("x-absent", json!(null)),
        ("x-user", json!("bob")),
        ("x-from-query", json!("hello")),
        ("x-exists", json!("yes")),
        ("x-old-was", json!("o")),
        ("x-app", json!("two")),
    ] {
        assert_eq!(h[name], want, "{name}: {h}");
    }

    // A JSON body: remove, rename, add (a template), append.
    let body = json!({"secret": 1, "a": "A", "list": "y"}).to_string();
    let r = send(
        p,
        req("POST", "/json")
            .header("content-type", "application/json")
            .header("x-v", "V")
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .unwrap(),
    )
    .await;
    let want = br#"{"b":"A","new":"V","list":["y","z"]}"#;
    assert_eq!(r.json()["body_len"], want.len(), "{:?}", r.json());
    assert_eq!(r.json()["body_sum"], sum(want));
    assert_eq!(
        r.json()["headers"]["content-length"],
        want.len().to_string()
    );
    // An empty JSON body gets what add and append bring.
    let r = send(
        p,
        req("POST", "/json")
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await;
    let want = br#"{"new":"","list":["z"]}"#;
    assert_eq!(r.json()["body_sum"], sum(want), "{:?}", r.json());

    // A multipart body, as curl -F sends one (a file part among the fields), in Kong's
    // order: rename (the new name at the end), remove, replace (delete, then set at the end),
    // add; append does not apply to multipart; the file part keeps its headers.
    let part = |name: &str, v: &str| {
        format!("--XyZ\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{v}\r\n")
    };
    let file = "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f.txt\"\r\nContent-Type: text/plain\r\n\r\nline 1\r\nline 2\r\n";
    let body = format!(
        "{}{}{}{}{file}--XyZ--\r\n",
        part("a", "A"),
        part("secret", "s"),
        part("r", "old"),
        part("list", "y")
    );
    let r = send(
        p,
        req("POST", "/multipart")
            .header("content-type", "multipart/form-data; boundary=XyZ")
            .header("x-v", "V")
            .body(http_body_util::Full::new(bytes::Bytes::from(body.clone())))
            .unwrap(),
    )
    .await;
    let want = format!(
        "{}{file}{}{}{}--XyZ--\r\n",
        part("list", "y"),
        part("b", "A"),
        part("r", "R"),
        part("new", "V")
    );
    assert_eq!(r.status, 200, "{:?}", r.json());
    assert_eq!(r.json()["body_len"], want.len(), "{:?}", r.json());
    assert_eq!(r.json()["body_sum"], sum(want.as_bytes()));
    assert_eq!(
        r.json()["headers"]["content-length"],
        want.len().to_string()
    );
    // Not multipart after all (no closing delimiter): sent on as it came.
    let broken = "--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nA";
    let r = send(
        p,
        req("POST", "/multipart")
            .header("content-type", "multipart/form-data; boundary=XyZ")
            .body(http_body_util::Full::new(bytes::Bytes::from(broken)))
            .unwrap(),
    )
    .await;
    assert_eq!(
        r.json()["body_sum"],
        sum(broken.as_bytes()),
        "{:?}",
        r.json()
    );

    // http_method GET: a form body joins the query.
    let r = send(
        p,
        req("POST", "/form?a=0")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(http_body_util::Full::new(bytes::Bytes::from("x=1&a=2")))
            .unwrap(),
    )
    .await;
    assert_eq!(r.json()["method"], "GET", "{:?}", r.json());
    assert_eq!(r.json()["uri"], "/?a=0&a=2&x=1");

    // Other routes are untouched.
    let r = call(p, "GET", "/plain?b=1&a=2", &[("x-remove", "1")]).await;
    assert_eq!(r.json()["uri"], "/?b=1&a=2");
    assert_eq!(r.json()["headers"]["x-remove"], "1");
}

#[tokio::test]
async fn bad_configs_are_refused_in_kongs_shape() {
    let gw = Gateway::sqlite().start();
    for (config, field, message) in [
        (
            json!({"http_method": "get"}),
            "http_method",
            "invalid value: get",
        ),
        (
            json!({"add": {"headers": ["x:$(os.getenv('HOME'))"]}}),
            "add",
            "unsupported template expression",
        ),
        (
            json!({"add": {"headers": ["x:$(headers.x-v)"]}}),
            "add",
            "headers[\\\"x-v\\\"] or headers.x_v",
        ),
    ] {
        let r = gw
            .admin(
                "POST",
                "/plugins",
                Some(json!({"name": "request-transformer", "config": config})),
            )
            .await;
        assert_eq!(r.status, 400, "{config}: {:?}", r.json());
        let text = r.json()["fields"]["config"][field].to_string();
        assert!(text.contains(message), "{config}: {:?}", r.json());
    }
}
