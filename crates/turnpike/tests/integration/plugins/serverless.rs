//! pre-function and post-function on the real binary: Lua code in every phase Kong runs it in
//! (certificate, rewrite, access, header_filter, body_filter, log), `kong.ctx.shared` across
//! them, the sandbox, and configs refused as Kong refuses them.

use crate::common::*;
use serde_json::json;

fn config(url: &str) -> String {
    format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: plain
    paths: [/a]
  - name: blue
    paths: [/b]
    headers: {{x-lane: [blue]}}
    plugins:
    - name: post-function
      config:
        access:
        - "kong.service.request.set_header('x-post', kong.ctx.shared.seen or 'none')"
        header_filter:
        - "kong.response.set_header('x-status-seen', kong.response.get_status())"
        body_filter:
        - "local b = kong.response.get_raw_body() if b then kong.response.set_raw_body(b:upper()) end"
  - name: deny
    paths: [/deny]
    plugins:
    - name: pre-function
      config:
        access:
        - "return kong.response.exit(451, {{ message = 'not here', path = kong.request.get_path() }})"
  - name: host
    paths: [/host]
    plugins:
    - name: pre-function
      config:
        access: ["kong.service.request.set_header('Host', 'lua.example')"]
  - name: boom
    paths: [/boom]
    plugins:
    - name: pre-function
      config:
        access: ["os.execute('touch /tmp/turnpike-sandbox-escaped')"]
plugins:
- name: pre-function
  config:
    rewrite:
    - |
      if kong.request.get_header('x-block') then
        return kong.response.exit(403, 'blocked in rewrite')
      end
      if kong.request.get_query_arg('lane') == 'blue' then
        kong.service.request.set_header('x-lane', 'blue')
      end
    access:
    - "kong.ctx.shared.seen = 'pre'"
- name: post-function
  config:
    log:
    - "kong.log.notice('log phase status=', kong.response.get_status(), ' route=', kong.router.get_route().name)"
"#
    )
}

#[tokio::test]
async fn lua_runs_in_every_request_phase() {
    let up = Upstream::start("lua");
    let gw = Gateway::with_config(&config(&up.url())).start();

    // Rewrite runs before the router: the header it sets makes /b match its route.
    assert_eq!(get(gw.proxy, "x", "/b").await.status, 404);
    let r = get(gw.proxy, "x", "/b?lane=blue").await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    // The route's post-function filtered the body (upper-cased) and the head.
    let body = String::from_utf8_lossy(&r.body).to_string();
    assert!(body.contains("\"UPSTREAM\":\"LUA\""), "{body}");
    let echoed: serde_json::Value = serde_json::from_str(&body.to_lowercase()).unwrap();
    assert_eq!(echoed["headers"]["x-lane"], "blue");
    // kong.ctx.shared: set by the global pre-function, read by the route's post-function.
    assert_eq!(echoed["headers"]["x-post"], "pre");
    assert_eq!(r.header("x-status-seen"), Some("200"));
    assert_eq!(
        r.header("content-length"),
        None,
        "the body's length changed"
    );

    // Rewrite answers before routing, for any path.
    let r = call(gw.proxy, "GET", "/nowhere", &[("x-block", "1")]).await;
    assert_eq!((r.status, &r.body[..]), (403, &b"blocked in rewrite"[..]));

    // An exit from the access phase, with a JSON body built from the request.
    let r = get(gw.proxy, "x", "/deny").await;
    assert_eq!(r.status, 451);
    assert_eq!(r.json(), json!({"message": "not here", "path": "/deny"}));
    assert_eq!(
        r.header("content-type"),
        Some("application/json; charset=utf-8")
    );

    // A Host header set by the code is the upstream's Host.
    let r = get(gw.proxy, "x", "/host").await;
    assert_eq!(r.json()["headers"]["host"], "lua.example");

    // The sandbox has no os.execute: the code fails and the client gets Kong's 500.
    let r = get(gw.proxy, "x", "/boom").await;
    assert_eq!(r.status, 500);
    assert_eq!(r.json(), json!({"message": "An unexpected error occurred"}));
    assert!(!std::path::Path::new("/tmp/turnpike-sandbox-escaped").exists());

    // Log phase: the global post-function logs each request of the route without its own.
    assert_eq!(get(gw.proxy, "x", "/a").await.status, 200);
    let logged = eventually(std::time::Duration::from_secs(5), async || {
        gw.log_text()
            .contains("[post-function] log phase status=200 route=plain")
    })
    .await;
    assert!(logged, "{}", gw.log_text());
    assert!(gw.log_text().contains("attempt to call field 'execute'"));
}

#[tokio::test]
async fn certificate_phase_may_refuse_a_handshake() {
    let up = Upstream::start("lua-tls");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: r
    paths: [/]
plugins:
- name: pre-function
  config:
    certificate:
    - |
      local name = ngx.var.ssl_server_name
      if name == 'blocked.test' then error('no certificate for ' .. name) end
      kong.log.notice('handshake for ', name)
"#,
        url = up.url()
    ))
    .start();
    let (r, _, _) = get_tls(gw.proxy_tls, "ok.test", "/", false).await;
    assert_eq!(r.status, 200);
    assert!(gw
        .log_text()
        .contains("[pre-function] handshake for ok.test"));
    let stream = tokio::net::TcpStream::connect(gw.proxy_tls).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("blocked.test").unwrap();
    let refused = tls_client(&[b"http/1.1"]).connect(name, stream).await;
    assert!(refused.is_err(), "the handshake went through");
    assert!(gw.log_text().contains("no certificate for blocked.test"));
}

#[tokio::test]
async fn lua_configs_are_checked_like_kong_checks_them() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "kong.yml",
        r#"_format_version: "3.0"
plugins:
- name: pre-function
  config:
    access: ["kong.log.err('hi')"]
"#,
    );
    let file = file.to_str().unwrap();
    let (ok, out) = run(&["config", "parse", file], &[]);
    assert!(ok, "{out}");
    // untrusted_lua = off: no config with Lua code loads.
    let (ok, out) = run(
        &["config", "parse", file],
        &[("TURNPIKE_UNTRUSTED_LUA", "off")],
    );
    assert!(!ok);
    assert!(
        out.contains("loading of untrusted Lua code disabled because 'untrusted_lua' config option is set to 'off'"),
        "{out}"
    );
    let (ok, out) = run(
        &["config", "parse", file],
        &[("TURNPIKE_UNTRUSTED_LUA", "maybe")],
    );
    assert!(!ok);
    assert!(out.contains("untrusted_lua"), "{out}");

    // Through the Admin API: a syntax error and a config with no code are schema violations.
    let gw = Gateway::sqlite().start();
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(json!({"name": "pre-function", "config": {"access": ["local = 1"]}})),
        )
        .await;
    assert_eq!(r.status, 400);
    let body = r.json();
    assert_eq!(body["name"], "schema violation");
    assert_eq!(body["code"], 2);
    let msg = body["fields"]["config"]["access"].to_string();
    assert!(msg.contains("error parsing pre-function"), "{body}");
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(json!({"name": "post-function", "config": {}})),
        )
        .await;
    assert_eq!(r.status, 400);
    assert!(r.json()["fields"]["@entity"]
        .to_string()
        .contains("at least one of these fields must be non-empty"));
    // Not on a consumer (Kong's no_consumer).
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(json!({"name": "post-function", "config": {"log": ["kong.log.err('x')"]}})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["config"]["certificate"], json!([]));
}

/// file-log's `custom_fields_by_lua`: Lua per field of the JSON line, with the request and
/// `kong.ctx.shared` as the plugins left them.
#[tokio::test]
async fn custom_fields_by_lua_shape_the_log_line() {
    let up = Upstream::start("lua-log");
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("requests.log");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes: [{{name: r, paths: [/]}}]
plugins:
- name: pre-function
  config:
    access: ["kong.ctx.shared.seen = 'pre-' .. kong.request.get_method()"]
- name: file-log
  config:
    path: "{log}"
    custom_fields_by_lua:
      tenant: "return kong.request.get_header('x-tenant')"
      shared: "return kong.ctx.shared.seen"
      request.size: "return nil"
      deep.status: "return kong.response.get_status() + 1"
"#,
        url = up.url(),
        log = log_path.display()
    ))
    .start();
    let r = call(gw.proxy, "GET", "/x", &[("x-tenant", "acme")]).await;
    assert_eq!(r.status, 200);
    let mut line = String::new();
    let written = eventually(std::time::Duration::from_secs(5), async || {
        line = std::fs::read_to_string(&log_path).unwrap_or_default();
        !line.is_empty()
    })
    .await;
    assert!(written, "{}", gw.log_text());
    let entry: serde_json::Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    assert_eq!(entry["tenant"], "acme");
    assert_eq!(entry["shared"], "pre-GET");
    assert_eq!(entry["deep"]["status"], 201);
    assert!(entry["request"].get("size").is_none(), "{entry}");
    assert_eq!(entry["request"]["method"], "GET", "the rest is Kong's");
}
