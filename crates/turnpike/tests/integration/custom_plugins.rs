//! An operator's own Lua plugin, installed as in Kong: named in `plugins`, found through
//! `lua_package_path` as `kong/plugins/<name>/handler.lua` and `schema.lua` (the fixture in
//! `lua-plugins/`), its schema's config validated and defaulted, its phases run with the PDK.

use serde_json::json;

use crate::common::*;

fn package_path() -> String {
    format!(
        "{}/tests/integration/lua-plugins/?.lua;;",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_lua_plugin_runs_as_kong_runs_it() {
    let up = Upstream::start("custom");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: s
  url: {}
  routes:
  - name: r
    paths: [/g]
    plugins:
    - name: greeting
      config: {{greeting: hi, times: 2, deny_path: /g/deny}}
  - name: loud
    paths: [/loud]
    plugins:
    - name: greeting
      config: {{mode: loud, header_name: X-Shout}}
"#,
        up.url()
    ))
    .env("TURNPIKE_PLUGINS", "bundled,greeting")
    .env("TURNPIKE_LUA_PACKAGE_PATH", &package_path())
    .start();

    // access: a header for the upstream built by a module of the plugin's own; header_filter:
    // a response header from what access kept in kong.ctx.plugin.
    let r = get(gw.proxy, "x", "/g").await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["headers"]["x-greeting"], "hi,hi");
    assert_eq!(r.header("x-greeted"), Some("hi,hi"));
    // The schema's defaults fill what the config leaves out.
    let r = get(gw.proxy, "x", "/loud").await;
    assert_eq!(r.json()["headers"]["x-shout"], "HELLO");
    // kong.response.exit from the access phase.
    let r = get(gw.proxy, "x", "/g/deny").await;
    assert_eq!(
        (r.status, r.json()),
        (403, json!({"message": "denied by greeting"}))
    );
    assert_eq!(r.header("x-greeted"), Some("no"));
    // The log phase ran.
    assert!(
        eventually(std::time::Duration::from_secs(5), async || gw
            .log_text()
            .contains("greeting logged 200"))
        .await,
        "{}",
        gw.log_text()
    );

    // The Admin API knows it as a bundled one: enabled, its schema with the config's fields
    // and defaults, its config checked against that schema.
    let enabled = gw.admin("GET", "/plugins/enabled", None).await.json();
    assert!(enabled["enabled_plugins"]
        .as_array()
        .unwrap()
        .contains(&json!("greeting")));
    let schema = gw
        .admin("GET", "/schemas/plugins/greeting", None)
        .await
        .json();
    let text = schema.to_string();
    assert!(text.contains("\"header_name\""), "{text}");
    assert!(text.contains("\"X-Greeting\""), "{text}");
    let bad = format!(
        r#"{{"_format_version": "3.0", "services": [{{"name": "s", "url": "{}", "routes": [{{"name": "r", "paths": ["/g"], "plugins": [{{"name": "greeting", "config": {{"times": 9, "mode": "quiet"}}}}]}}]}}]}}"#,
        up.url()
    );
    let r = admin_raw(
        gw.admin,
        "POST",
        "/config",
        "application/json",
        bad.into_bytes(),
    )
    .await;
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    let body = String::from_utf8_lossy(&r.body).to_string();
    assert!(body.contains("times") && body.contains("mode"), "{body}");
    // The running config is untouched.
    assert_eq!(get(gw.proxy, "x", "/g").await.status, 200);
}

#[test]
fn a_plugin_named_but_not_installed_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let conf = write(dir.path(), "kong.yml", "_format_version: \"3.0\"\n");
    let path = package_path();
    let (ok, out) = run(
        &["config", "parse", conf.to_str().unwrap()],
        &[
            ("TURNPIKE_PLUGINS", "bundled,nope"),
            ("TURNPIKE_LUA_PACKAGE_PATH", path.as_str()),
        ],
    );
    assert!(!ok, "{out}");
    assert!(
        out.contains("plugin 'nope' enabled but not installed"),
        "{out}"
    );
}
