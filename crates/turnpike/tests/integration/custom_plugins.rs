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

/// A gateway on `doc` with `plugins = bundled,<plugin>`, custom plugins found through `path`.
fn with_plugin(doc: &str, plugin: &str, path: &str) -> Gateway {
    Gateway::with_config(doc)
        .env("TURNPIKE_PLUGINS", &format!("bundled,{plugin}"))
        .env("TURNPIKE_LUA_PACKAGE_PATH", path)
        .start()
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
      config: {{mode: loud, header_name: X-Shout, secret: "{{vault://env/greeting-secret}}"}}
"#,
        up.url()
    ))
    .env("TURNPIKE_PLUGINS", "bundled,greeting")
    .env("TURNPIKE_LUA_PACKAGE_PATH", &package_path())
    .env("GREETING_SECRET", "abc123")
    .start();

    // access: a header for the upstream built by a module of the plugin's own; header_filter:
    // a response header from what access kept in kong.ctx.plugin.
    let r = get(gw.proxy, "x", "/g").await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["headers"]["x-greeting"], "hi,hi");
    assert_eq!(r.header("x-greeted"), Some("hi,hi"));
    // init_worker ran once in the worker's state, whatever the number of configs and requests.
    assert_eq!(r.json()["headers"]["x-worker-inits"], "1");
    // configure had every config of the plugin (the second one's greeting is its default).
    assert_eq!(r.json()["headers"]["x-configured"], "hello,hi");
    // kong.plugin.get_id: this config's plugin entity.
    let plugins = gw.admin("GET", "/routes/r/plugins", None).await.json();
    assert_eq!(
        r.json()["headers"]["x-plugin-id"],
        plugins["data"][0]["id"],
        "{plugins}"
    );
    // ngx.shared: one count for the node, whichever worker served each request (each on a
    // connection of its own).
    let mut seen = Vec::new();
    for _ in 0..4 {
        let r = get(gw.proxy, "x", "/g").await;
        seen.push(r.json()["headers"]["x-seen"].as_str().unwrap().to_string());
    }
    assert_eq!(seen, ["2", "3", "4", "5"]);
    // A plugin whose modules read the body gets it in access.
    let r = send(
        gw.proxy,
        req("POST", "/g")
            .body(http_body_util::Full::new(bytes::Bytes::from_static(
                b"twelve bytes",
            )))
            .unwrap(),
    )
    .await;
    assert_eq!(r.json()["headers"]["x-body-length"], "12", "{}", r.json());
    // The schema's defaults fill what the config leaves out.
    let r = get(gw.proxy, "x", "/loud").await;
    assert_eq!(r.json()["headers"]["x-shout"], "HELLO");
    // kong.vault.get: the env vault's secret (GREETING_SECRET, set for the gateway).
    assert_eq!(r.json()["headers"]["x-secret-length"], "6", "{}", r.json());
    assert_eq!(r.json()["headers"]["x-worker-inits"], "1");
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
    // A new configuration: configure sees its configs (one now).
    let one = format!(
        r#"{{"_format_version": "3.0", "services": [{{"name": "s", "url": "{}", "routes": [{{"name": "r", "paths": ["/g"], "plugins": [{{"name": "greeting", "config": {{"greeting": "hey"}}}}]}}]}}]}}"#,
        up.url()
    );
    let r = admin_raw(
        gw.admin,
        "POST",
        "/config",
        "application/json",
        one.into_bytes(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let r = get(gw.proxy, "x", "/g").await;
    assert_eq!(r.json()["headers"]["x-configured"], "hey");
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

/// Plugin folders of a public repository (`plugins/<name>/{handler,schema}.lua` under
/// `root` at `rev`), written out of a local mirror of it (`$TURNPIKE_TEST_MIRRORS/<repo>/repo`,
/// default `/work/.mirror`, as the tool library's `fetch` leaves it) into a package path of
/// their own, as `kong/plugins/<name>/`: `None` when there is no mirror here.
fn plugins_from_mirror(
    repo: &str,
    rev: &str,
    root: &str,
    names: &[&str],
    into: &std::path::Path,
) -> Option<String> {
    let mirrors = std::env::var("TURNPIKE_TEST_MIRRORS").unwrap_or_else(|_| "/work/.mirror".into());
    let git_dir = std::path::Path::new(&mirrors).join(repo).join("repo");
    for name in names {
        let dir = into.join("kong/plugins").join(name);
        std::fs::create_dir_all(&dir).ok()?;
        for file in ["handler.lua", "schema.lua"] {
            let out = std::process::Command::new("git")
                .arg("--git-dir")
                .arg(&git_dir)
                .arg("show")
                .arg(format!("{rev}:{root}/{name}/{file}"))
                .output()
                .ok()?;
            if !out.status.success() {
                return None;
            }
            std::fs::write(dir.join(file), out.stdout).ok()?;
        }
    }
    Some(format!("{}/?.lua;;", into.display()))
}

/// Kong's plugin template (github.com/Kong/kong-plugin) at a known commit.
fn template_from_mirror(into: &std::path::Path) -> Option<String> {
    plugins_from_mirror(
        "Kong+kong-plugin",
        "f7a85cbc25137c8db5779912d42bda76d895e95b",
        "kong/plugins",
        &["myplugin"],
        into,
    )
}

/// Kong's plugin template (`myplugin`), unchanged, from a local mirror (not copied into this
/// repository): what its own integration spec checks (a request header for the upstream, a
/// response header), its schema's defaults and entity checks with Kong's messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kongs_plugin_template_runs_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(path) = template_from_mirror(tmp.path()) else {
        eprintln!(
            "skipped: no mirror of github.com/Kong/kong-plugin here (see lua-plugins/README.md)"
        );
        return;
    };
    let up = Upstream::start("template");
    let doc = json!({"_format_version": "3.0", "services": [{"name": "s", "url": up.url(),
        "routes": [{"name": "r", "hosts": ["test1.com"], "plugins": [{"name": "myplugin"}]}]}]});
    let gw = with_plugin(&doc.to_string(), "myplugin", &path);
    let r = get(gw.proxy, "test1.com", "/request").await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["headers"]["hello-world"], "this is on a request");
    assert_eq!(r.header("bye-world"), Some("this is on the response"));

    // Its entity check (distinct header names) and its `gt = 0`, refused in Kong's shape.
    let post = async |config: serde_json::Value| {
        let doc = json!({"_format_version": "3.0", "services": [{"name": "s", "url": up.url(),
            "routes": [{"name": "r", "hosts": ["test1.com"],
                        "plugins": [{"name": "myplugin", "config": config}]}]}]});
        gw.admin("POST", "/config", Some(doc)).await
    };
    let r = post(json!({"request_header": "x-same", "response_header": "x-same"})).await;
    assert_eq!(r.status, 400);
    let text = r.json().to_string();
    assert!(
        text.contains(
            "values of these fields must be distinct: 'request_header', 'response_header'"
        ),
        "{text}"
    );
    let r = post(json!({"ttl": 0})).await;
    assert_eq!(r.status, 400, "{}", r.json());
    assert!(r.json().to_string().contains("ttl"), "{}", r.json());
    assert_eq!(
        get(gw.proxy, "test1.com", "/request")
            .await
            .header("bye-world"),
        Some("this is on the response")
    );
}

/// A server's own runtime, let go without waiting when the test ends (a runtime dropped in
/// the test's async context would panic).
struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// An introspection endpoint for `token-introspect`: `token=good` is active (subject
/// `alice`), anything else is not; the number of calls it answered.
fn introspection_server() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    OwnRuntime,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let logs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let logged = logs.clone();
    rt.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let counted = counted.clone();
            let logged = logged.clone();
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let counted = counted.clone();
                        let logged = logged.clone();
                        async move {
                            use http_body_util::BodyExt;
                            let is_log = req.uri().path() == "/log";
                            let form = req.into_body().collect().await?.to_bytes();
                            if is_log {
                                let entry = String::from_utf8_lossy(&form).into_owned();
                                logged.lock().unwrap().push(entry);
                            } else {
                                counted.fetch_add(1, Ordering::SeqCst);
                            }
                            let body = if &form[..] == b"token=good" {
                                r#"{"active": true, "sub": "alice"}"#
                            } else {
                                r#"{"active": false}"#
                            };
                            Ok::<_, hyper::Error>(
                                http::Response::builder()
                                    .header("content-type", "application/json")
                                    .header("x-introspected-by", "idp-1")
                                    .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                                    .unwrap(),
                            )
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, calls, logs, OwnRuntime(Some(rt)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_plugin_calls_out_with_resty_http_and_caches_with_kong_cache() {
    use std::sync::atomic::Ordering;
    let up = Upstream::start("introspected");
    let (idp, calls, logs, _idp_rt) = introspection_server();
    let gw = with_plugin(
        &format!(
            r#"_format_version: "3.0"
services:
- name: s
  url: {}
  routes:
  - name: r
    paths: [/api]
    plugins:
    - name: token-introspect
      config: {{introspection_url: "http://{idp}/introspect", pause: 0.05, log_url: "http://{idp}/log"}}
  - name: down
    paths: [/down]
    plugins:
    - name: token-introspect
      config: {{introspection_url: "http://127.0.0.1:1/introspect", timeout: 500}}
"#,
            up.url()
        ),
        "token-introspect",
        &package_path(),
    );
    let with_token = |token: &str| vec![("authorization".to_string(), format!("Bearer {token}"))];
    let call_with = async |path: &str, headers: Vec<(String, String)>| {
        let h: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        call(gw.proxy, "GET", path, &h).await
    };

    // The plugin waited (ngx.sleep, then the HTTP call) and the request went on with what the
    // introspection endpoint said.
    let r = call_with("/api/x", with_token("good")).await;
    assert_eq!(
        r.status,
        200,
        "{}\n{}",
        String::from_utf8_lossy(&r.body),
        gw.log_text()
    );
    assert_eq!(r.json()["headers"]["x-subject"], "alice");
    assert_eq!(r.json()["headers"]["x-introspected-by"], "idp-1");
    // header_filter cannot call out: the call answers OpenResty's message.
    assert_eq!(
        r.header("x-header-filter-http"),
        Some("API disabled in the context of header_filter")
    );
    // kong.cache kept the answer: no more calls for the same token on this worker; a few
    // requests over new connections may land on the other worker (one call there).
    for _ in 0..6 {
        let r = call_with("/api/x", with_token("good")).await;
        assert_eq!(r.json()["headers"]["x-subject"], "alice");
    }
    assert!(
        calls.load(Ordering::SeqCst) <= 2,
        "{}",
        calls.load(Ordering::SeqCst)
    );
    // An inactive token is a cached miss: 401, and asked once per worker at most.
    let before = calls.load(Ordering::SeqCst);
    for _ in 0..4 {
        let r = call_with("/api/x", with_token("bad")).await;
        assert_eq!(
            (r.status, r.json()),
            (401, json!({"message": "inactive token"}))
        );
    }
    assert!(calls.load(Ordering::SeqCst) - before <= 2);
    // No token: the plugin's own answer, without waiting.
    let r = call(gw.proxy, "GET", "/api/x", &[]).await;
    assert_eq!((r.status, r.json()), (401, json!({"message": "no token"})));
    // The endpoint is down: resty.http's error reaches the plugin, which answers 502.
    let r = call_with("/down", with_token("good")).await;
    assert_eq!(
        (r.status, r.json()),
        (502, json!({"message": "introspection failed"}))
    );
    assert!(
        gw.log_text().contains("introspection failed"),
        "{}",
        gw.log_text()
    );
    // Many requests at once, each waiting (ngx.sleep, then kong.cache): all are answered.
    let all: Vec<_> = (0..20)
        .map(|_| {
            let proxy = gw.proxy;
            tokio::spawn(async move {
                call(proxy, "GET", "/api/x", &[("authorization", "Bearer good")])
                    .await
                    .status
            })
        })
        .collect();
    for t in all {
        assert_eq!(t.await.unwrap(), 200);
    }
    // The log phase's timer shipped each entry (Kong's serialized one) over HTTP.
    assert!(
        eventually(std::time::Duration::from_secs(10), async || logs
            .lock()
            .unwrap()
            .len()
            >= 30)
        .await,
        "{} entries\n{}",
        logs.lock().unwrap().len(),
        gw.log_text()
    );
    let first: serde_json::Value = serde_json::from_str(&logs.lock().unwrap()[0]).unwrap();
    assert_eq!(first["request"]["uri"], "/api/x", "{first}");
    assert_eq!(first["response"]["status"], 200, "{first}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kong_service_set_target_sends_the_request_elsewhere() {
    let first = Upstream::start("first");
    let second = Upstream::start("second");
    let gw = with_plugin(
        &format!(
            r#"_format_version: "3.0"
services:
- name: s
  url: {}
  routes:
  - name: r
    paths: [/t]
    plugins:
    - name: route-by-header
"#,
            first.url()
        ),
        "route-by-header",
        &package_path(),
    );
    let r = get(gw.proxy, "x", "/t").await;
    assert_eq!(r.json()["upstream"], "first");
    let target = second.addr.to_string();
    let r = call(gw.proxy, "GET", "/t", &[("x-target", target.as_str())]).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["upstream"], "second");
    // The Host header is the target's, as Kong's balancer makes it.
    assert_eq!(r.json()["headers"]["host"], target.as_str());
    // What is not there says so, naming the function.
    assert_eq!(
        r.json()["headers"]["x-set-upstream"],
        "kong.service.set_upstream is not implemented by Turnpike"
    );
    // Kong's argument check.
    let r = call(gw.proxy, "GET", "/t", &[("x-target", "127.0.0.1:70000")]).await;
    assert_eq!(
        (r.status, r.json()),
        (
            400,
            json!({"message": "port must be an integer between 0 and 65535: given 70000"})
        )
    );
    // The next request without the header goes to the service again (the target was the
    // request's own).
    let r = get(gw.proxy, "x", "/t").await;
    assert_eq!(r.json()["upstream"], "first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_auth_plugin_authenticates_with_kong_client_authenticate() {
    let up = Upstream::start("authed");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("entries.log");
    let gw = with_plugin(
        &format!(
            r#"_format_version: "3.0"
consumers:
- username: grace
  id: 2f8f1a0e-51a4-4b5c-9d6e-2b3c4d5e6f70
services:
- name: s
  url: {}
  routes:
  - name: r
    paths: [/a]
    plugins:
    - name: header-auth
    - name: file-log
      config: {{path: {}}}
  - name: lookup
    paths: [/lookup]
    plugins:
    - name: header-auth
      config: {{lookup: true}}
"#,
            up.url(),
            log.display()
        ),
        "header-auth",
        &package_path(),
    );
    let r = call(gw.proxy, "GET", "/a", &[("x-user", "ada")]).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let h = r.json()["headers"].clone();
    // The consumer the plugin set is the request's: Kong's upstream headers carry it.
    assert_eq!(h["x-seen-consumer"], "ada", "{h}");
    assert_eq!(h["x-consumer-id"], "id-ada", "{h}");
    assert_eq!(h["x-consumer-username"], "ada", "{h}");
    assert_eq!(h["x-credential-identifier"], "cred-ada", "{h}");
    let r = call(gw.proxy, "GET", "/a", &[]).await;
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Unauthorized"}))
    );
    // kong.client.load_consumer: the gateway's consumer, by username or by id.
    let r = call(gw.proxy, "GET", "/lookup", &[("x-user", "grace")]).await;
    assert_eq!(
        r.status,
        200,
        "{}\n{}",
        String::from_utf8_lossy(&r.body),
        gw.log_text()
    );
    let h = r.json()["headers"].clone();
    assert_eq!(
        h["x-consumer-id"], "2f8f1a0e-51a4-4b5c-9d6e-2b3c4d5e6f70",
        "{h}"
    );
    assert_eq!(h["x-found-by-id"], "grace", "{h}");
    assert_eq!(h["x-not-by-username"], "true", "{h}");
    assert_eq!(
        h["x-db-consumer"], "grace,2f8f1a0e-51a4-4b5c-9d6e-2b3c4d5e6f70",
        "kong.db.consumers reads: {h}"
    );
    let r = call(gw.proxy, "GET", "/lookup", &[("x-user", "nobody")]).await;
    assert_eq!(
        (r.status, r.json()),
        (403, json!({"message": "unknown consumer nobody"}))
    );
}

/// Kong's own test plugins (`spec/fixtures/custom_plugins/kong/plugins/<name>` of Kong 3.9.1,
/// Apache-2.0), from a mirror of github.com/Kong/kong.
fn kong_fixtures_from_mirror(into: &std::path::Path, names: &[&str]) -> Option<String> {
    plugins_from_mirror(
        "Kong+kong",
        "3.9.1",
        "spec/fixtures/custom_plugins/kong/plugins",
        names,
        into,
    )
}

/// Seven of the plugins Kong's own specs run (short-circuit, rewriter, dummy, error-generator,
/// muti-external-http-calls, cache, logger), unchanged, doing what Kong's specs expect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kongs_own_test_plugins_run_unchanged() {
    let names = [
        "short-circuit",
        "rewriter",
        "dummy",
        "error-generator",
        "muti-external-http-calls",
        "cache",
        "logger",
    ];
    let tmp = tempfile::tempdir().unwrap();
    let Some(path) = kong_fixtures_from_mirror(tmp.path(), &names) else {
        eprintln!("skipped: no mirror of github.com/Kong/kong here (fetch github:Kong/kong)");
        return;
    };
    let up = Upstream::start("kong-fixtures");
    let doc = format!(
        r#"_format_version: "3.0"
plugins:
- name: rewriter
  config: {{value: rewritten}}
services:
- name: s
  url: {url}
  routes:
  - name: short
    paths: [/short]
    plugins:
    - name: short-circuit
      config: {{status: 418, message: teapot}}
  - name: dummy
    paths: [/dummy]
    plugins:
    - name: dummy
      config: {{resp_header_value: fixture, resp_headers: {{x-extra: yes}}, append_body: "!"}}
  - name: errors
    paths: [/error]
    plugins:
    - name: error-generator
      config: {{access: true}}
  - name: calls
    paths: [/calls]
    plugins:
    - name: muti-external-http-calls
      config: {{calls: 3}}
  - name: cache
    paths: [/cache]
    plugins:
    - name: cache
  - name: logged
    paths: [/logged]
    plugins:
    - name: logger
"#,
        url = up.url()
    );
    let gw = Gateway::with_config(&doc)
        .env("TURNPIKE_PLUGINS", &format!("bundled,{}", names.join(",")))
        .env("TURNPIKE_LUA_PACKAGE_PATH", &path)
        .start();

    // short-circuit: its status and body, and init_worker ran first (Kong's spec).
    let r = get(gw.proxy, "x", "/short").await;
    assert_eq!(
        (r.status, r.json()),
        (418, json!({"status": 418, "message": "teapot"})),
        "{}",
        gw.log_text()
    );
    assert_eq!(r.header("kong-init-worker-called"), Some("true"));
    // rewriter (global, rewrite phase): the header reaches the upstream.
    let r = get(gw.proxy, "x", "/dummy").await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    // dummy: a response header set in access, headers from header_filter, and the body
    // changed in body_filter (its last byte replaced).
    assert_eq!(r.header("dummy-plugin-access-header"), Some("dummy"));
    assert_eq!(r.header("dummy-plugin"), Some("fixture"));
    assert_eq!(r.header("x-extra"), Some("yes"));
    let body = String::from_utf8_lossy(&r.body).to_string();
    assert!(body.ends_with('!'), "{body}");
    let up_seen = get(gw.proxy, "x", "/calls").await;
    // muti-external-http-calls: failed calls to names that do not exist, each under pcall,
    // leave the request to go on.
    assert_eq!(up_seen.status, 200, "{}", gw.log_text());
    assert_eq!(up_seen.json()["headers"]["rewriter"], "rewritten");
    // error-generator: an error in access is Kong's 500.
    let r = get(gw.proxy, "x", "/error").await;
    assert_eq!(
        (r.status, r.json()),
        (500, json!({"message": "An unexpected error occurred"}))
    );
    assert!(
        gw.log_text().contains("[error-generator] access"),
        "{}",
        gw.log_text()
    );
    // cache: kong.cache keeps the first value a key got (Kong's spec posts a second one), on
    // one connection (one worker, whose cache it is).
    let (mut client, _conn) = h1_client(gw.proxy).await;
    let mut post = async |value: &str| {
        let form = format!("cache_key=greeting&cache_value={value}");
        let r = http::Request::post("/cache")
            .header("host", "x")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(http_body_util::Full::new(bytes::Bytes::from(form)))
            .unwrap();
        client.ready().await.expect("the connection stays open");
        collect(client.send_request(r).await.unwrap()).await
    };
    let r = post("first").await;
    assert_eq!(
        (r.status, r.json()),
        (200, json!({"message": "first"})),
        "{}",
        gw.log_text()
    );
    let r = post("second").await;
    assert_eq!((r.status, r.json()), (200, json!({"message": "first"})));
    // logger: each phase it has (here, on a route: not rewrite) logs, in the node's log.
    let _ = get(gw.proxy, "x", "/logged").await;
    let phases = [
        "init_worker phase",
        "access phase",
        "header_filter phase",
        "body_filter phase",
        "log phase",
    ];
    assert!(
        eventually(std::time::Duration::from_secs(5), async || {
            let log = gw.log_text();
            phases.iter().all(|p| log.contains(p))
        })
        .await,
        "{}",
        gw.log_text()
    );
}

/// The worked example of the README's "Your own plugins", taken from the README itself (its
/// first two Lua blocks there: handler.lua and schema.lua), runs as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_own_plugin_example_runs_as_written() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let section = &readme[readme.find("## Your own plugins").expect("the section")..];
    let blocks: Vec<&str> = section
        .split("```lua\n")
        .skip(1)
        .take(2)
        .map(|b| &b[..b.find("```").unwrap()])
        .collect();
    assert_eq!(blocks.len(), 2, "two Lua blocks in the section");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kong/plugins/hello");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("handler.lua"), blocks[0]).unwrap();
    std::fs::write(dir.join("schema.lua"), blocks[1]).unwrap();
    // The lookup service: the README's plugin asks it `?name=<name>`.
    let names = Upstream::start("names");
    let up = Upstream::start("hello-upstream");
    let gw = with_plugin(
        &format!(
            r#"_format_version: "3.0"
services:
- name: my-service
  url: {}
  routes:
  - name: r
    paths: [/hello]
    plugins:
    - name: hello
      config: {{lookup_url: "{}/greeting"}}
"#,
            up.url(),
            names.url()
        ),
        "hello",
        &format!("{}/?.lua;;", tmp.path().display()),
    );
    let r = get(gw.proxy, "x", "/hello").await;
    assert_eq!(
        r.status,
        200,
        "{}\n{}",
        String::from_utf8_lossy(&r.body),
        gw.log_text()
    );
    // The lookup service's answer (the test upstream echoes what it got) is the greeting.
    let greeting: serde_json::Value =
        serde_json::from_str(r.json()["headers"]["x-greeting"].as_str().unwrap()).unwrap();
    assert_eq!(greeting["uri"], "/greeting?name=world", "{greeting}");
    let asked = || names.requests.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(asked(), 1);
    // kong.cache kept it: no second look-up from this worker.
    let _ = get(gw.proxy, "x", "/hello").await;
    assert!(asked() <= 2);
}

/// A global plugin's `certificate` phase runs in the TLS handshake (Kong's logger fixture
/// logs it); an error there aborts the handshake (Kong's error-generator fixture).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_plugins_certificate_phase_runs_in_the_handshake() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(path) = kong_fixtures_from_mirror(tmp.path(), &["logger", "error-generator"]) else {
        eprintln!("skipped: no mirror of github.com/Kong/kong here (fetch github:Kong/kong)");
        return;
    };
    let up = Upstream::start("cert-phase");
    let doc = |plugin: &str| {
        format!(
            r#"_format_version: "3.0"
plugins:
- {plugin}
services:
- name: s
  url: {}
  routes:
  - name: r
    paths: [/]
"#,
            up.url()
        )
    };
    let gw = Gateway::with_config(&doc("name: logger"))
        .env("TURNPIKE_PLUGINS", "bundled,logger,error-generator")
        .env("TURNPIKE_LUA_PACKAGE_PATH", &path)
        .start();
    let (r, _, _) = get_tls(gw.proxy_tls, "tls.test", "/", false).await;
    assert_eq!(r.status, 200);
    assert!(
        eventually(std::time::Duration::from_secs(5), async || gw
            .log_text()
            .contains("certificate phase"))
        .await,
        "{}",
        gw.log_text()
    );
    // An error in the certificate phase: no handshake.
    let r = admin_raw(
        gw.admin,
        "POST",
        "/config",
        "text/yaml",
        doc("name: error-generator\n  config: {certificate: true}").into_bytes(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let stream = tokio::net::TcpStream::connect(gw.proxy_tls).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("tls.test".to_string()).unwrap();
    let refused = tls_client(&[b"http/1.1"]).connect(name, stream).await;
    assert!(refused.is_err(), "the handshake went through");
    assert!(
        gw.log_text().contains("[error-generator] certificate"),
        "{}",
        gw.log_text()
    );
}

/// Kong's response phase: a plugin with `response` gets the upstream's response read whole
/// (a streamed, chunked one too), may change its status and headers or replace it, and the
/// client gets the body with its length; the header_filter phase still reads the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_response_phase_gets_the_upstreams_response_whole() {
    let up = Upstream::start("buffered");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: s
  url: {}
  routes:
  - name: wrap
    paths: [/env]
    plugins:
    - name: envelope
  - name: hide
    paths: [/hide]
    plugins:
    - name: envelope
      config: {{hide_errors: true}}
  - name: pass
    paths: [/pass]
    plugins:
    - name: envelope
      config: {{wrap: false, status: 201}}
  - name: buffering
    paths: [/buffering]
    plugins:
    - name: pre-function
      config: {{access: ["kong.service.request.enable_buffering()"]}}
    - name: post-function
      config:
        header_filter:
        - |
          kong.response.set_header("X-Length", #kong.service.response.get_raw_body())
  - name: streaming
    paths: [/streaming]
    plugins:
    - name: post-function
      config:
        header_filter:
        - |
          local ok, err = pcall(kong.service.response.get_raw_body)
          kong.response.set_header("X-Error", (tostring(err):gsub("\n.*", "")))
"#,
        up.url()
    ))
    .env("TURNPIKE_PLUGINS", "bundled,envelope")
    .env("TURNPIKE_LUA_PACKAGE_PATH", &package_path())
    .start_h2();
    // Wrapped: the plugin's own answer from the upstream's body, the upstream's headers kept.
    let r = get(gw.proxy, "x", "/env/items?x=1").await;
    assert_eq!(r.status, 200, "{}", gw.log_text());
    let j = r.json();
    assert_eq!(j["envelope"], "v1");
    assert_eq!(j["mime"], "application/json");
    assert_eq!(j["data"]["uri"], "/items?x=1", "{j}");
    assert_eq!(r.header("x-enveloped"), Some("yes"));
    assert_eq!(r.header("x-upstream"), Some("buffered"));
    assert_eq!(
        r.header("content-length"),
        Some(r.body.len().to_string().as_str())
    );
    let upstream_bytes: usize = r.header("x-upstream-bytes").unwrap().parse().unwrap();
    assert!(upstream_bytes > 50, "{upstream_bytes}");
    // After the exit, header_filter still reads the upstream's buffered body (as Kong).
    assert_eq!(
        r.header("x-seen-in-header-filter"),
        r.header("x-upstream-bytes")
    );
    // An upstream error replaced by the plugin's answer.
    let r = get(gw.proxy, "x", "/hide/status/503").await;
    assert_eq!(r.status, 502);
    assert_eq!(
        r.json(),
        json!({"message": "upstream failed", "upstream_status": 503})
    );
    // A streamed (chunked) body of 300,000 bytes, read whole: its length announced, the status
    // the plugin set, the header_filter phase seeing the same body.
    let r = get(gw.proxy, "x", "/pass/bytes/300000").await;
    assert_eq!(r.status, 201);
    assert_eq!(r.body.len(), 300_000);
    assert!(r.body.iter().all(|b| *b == b'x'));
    assert_eq!(r.header("content-length"), Some("300000"));
    assert_eq!(r.header("transfer-encoding"), None);
    assert_eq!(r.header("x-upstream-bytes"), Some("300000"));
    assert_eq!(r.header("x-seen-in-header-filter"), Some("300000"));
    // HEAD: no body, the upstream's length kept.
    let sized = get(gw.proxy, "x", "/pass/sized").await;
    let r = call(gw.proxy, "HEAD", "/pass/sized", &[]).await;
    assert_eq!(r.status, 201);
    assert!(r.body.is_empty());
    assert_eq!(r.header("x-upstream-bytes"), Some("0"));
    // (The echo of a HEAD differs from a GET's, its length too.)
    let length: usize = r.header("content-length").unwrap().parse().unwrap();
    assert!(length > 100 && sized.status == 201, "{length}");
    // Buffering asked for in access: header_filter reads the body.
    let r = get(gw.proxy, "x", "/buffering/sized").await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("x-length"),
        Some(r.body.len().to_string().as_str())
    );
    // Not buffered: Kong's error names the way to ask for it.
    let r = get(gw.proxy, "x", "/streaming").await;
    assert_eq!(r.status, 200);
    assert!(
        r.header("x-error")
            .unwrap()
            .contains("service body is only available with buffered proxying"),
        "{:?}",
        r.header("x-error")
    );
    // An HTTP/2 client (h2c) gets the buffered response too, its length announced.
    let mut h2 = h2c_client(gw.proxy).await;
    let resp = h2
        .send_request(
            http::Request::get("http://x/pass/bytes/300000")
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let r = collect(resp).await;
    assert_eq!(r.status, 201);
    assert_eq!(r.body.len(), 300_000);
    assert_eq!(r.header("content-length"), Some("300000"));
    assert_eq!(r.header("x-upstream-bytes"), Some("300000"));
    // An HTTP/1.0 client and a Connection: close one get the whole body with its length.
    for raw in [
        "GET /pass/bytes/70000 HTTP/1.0\r\nHost: x\r\n\r\n",
        "GET /pass/bytes/70000 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ] {
        let text = until_closed(gw.proxy, raw.as_bytes()).await;
        let (head, body) =
            text.split_at(text.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4);
        let head = String::from_utf8_lossy(head).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 201"), "{head}");
        assert!(head.contains("content-length: 70000\r\n"), "{head}");
        assert_eq!(body.len(), 70_000);
    }
}

/// Kong's own buffered-proxying fixtures (`enable-buffering`, `enable-buffering-response`)
/// doing what Kong's `24-buffered_spec.lua` expects of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kongs_buffered_proxying_spec_cases_pass() {
    use md5::Digest;
    let tmp = tempfile::tempdir().unwrap();
    let Some(path) = kong_fixtures_from_mirror(
        tmp.path(),
        &["enable-buffering", "enable-buffering-response"],
    ) else {
        eprintln!("skipped: no mirror of github.com/Kong/kong here (fetch github:Kong/kong)");
        return;
    };
    let up = Upstream::start("mock");
    let dead = free_port();
    let route = |n: &str, plugin: &str, phase: &str, mode: &str| {
        format!(
            "  - paths: [/{n}]\n    plugins:\n    - name: {plugin}\n      config: {{phase: {phase}, mode: {mode}}}\n"
        )
    };
    let doc = format!(
        "_format_version: \"3.0\"\nservices:\n- name: s\n  url: {}\n  routes:\n{}{}{}{}- name: s502\n  url: http://127.0.0.1:{dead}\n  routes:\n{}",
        up.url(),
        route("1", "enable-buffering", "header_filter", "md5-header"),
        route("2", "enable-buffering", "header_filter", "modify-json"),
        route("3", "enable-buffering-response", "response", "md5-header"),
        route("4", "enable-buffering-response", "response", "modify-json"),
        route("502", "enable-buffering-response", "header_filter", "md5-header"),
    );
    let gw = Gateway::with_config(&doc)
        .env(
            "TURNPIKE_PLUGINS",
            "bundled,enable-buffering,enable-buffering-response",
        )
        .env("TURNPIKE_LUA_PACKAGE_PATH", &path)
        .start();
    let md5 = |b: &[u8]| hex::encode(md5::Md5::digest(b));
    for (path, status) in [("/1/status/231", 231), ("/3/status/235", 235)] {
        let r = get(gw.proxy, "x", path).await;
        assert_eq!(r.status, status, "{}", gw.log_text());
        assert_eq!(r.header("md5"), Some(md5(&r.body).as_str()), "{path}");
        let r = send(
            gw.proxy,
            req("HEAD", path)
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .unwrap(),
        )
        .await;
        assert_eq!(r.status, status);
        assert!(r.body.is_empty());
        assert_eq!(r.header("md5"), Some(md5(b"").as_str()), "HEAD {path}");
    }
    for (path, status) in [("/2/status/233", 233), ("/4/status/237", 237)] {
        let r = get(gw.proxy, "x", path).await;
        assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(
            r.json()["modified"],
            true,
            "{path}: {}\n{}",
            r.json(),
            gw.log_text()
        );
        assert_eq!(r.header("modified"), Some("yes"));
    }
    let r = get(gw.proxy, "x", "/502").await;
    assert_eq!(r.status, 502);
    assert_eq!(r.header("md5"), None);
}

/// Sends `request` on a new connection and reads until the gateway closes it.
async fn until_closed(addr: std::net::SocketAddr, request: &[u8]) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(request).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(20), c.read_to_end(&mut out))
        .await
        .expect("the gateway closes the connection")
        .unwrap();
    out
}

/// A plugin with its own entity (`daos.lua`): declared in a declarative file under its
/// consumer, read by the plugin through `kong.db` (and `kong.cache`), served by the Admin API
/// at the plugin's own paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugins_own_entity_is_declared_read_and_served() {
    let up = Upstream::start("clients");
    let gw = with_plugin(
        &format!(
            r#"_format_version: "3.0"
consumers:
- username: alice
  api_clients:
  - client_name: app-1
    tier: gold
  - client_name: app-2
- username: bob
services:
- name: s
  url: {}
  routes:
  - name: r
    paths: [/c]
    plugins:
    - name: api-clients
"#,
            up.url()
        ),
        "api-clients",
        &package_path(),
    );
    let alice = gw.admin("GET", "/consumers/alice", None).await.json();
    let as_client = |client: Option<&'static str>| {
        let mut r = req("GET", "/c");
        if let Some(c) = client {
            r = r.header("x-client", c);
        }
        send(
            gw.proxy,
            r.body(http_body_util::Empty::<bytes::Bytes>::new())
                .unwrap(),
        )
    };
    let r = as_client(Some("app-1")).await;
    assert_eq!(
        r.status,
        200,
        "{}\n{}",
        String::from_utf8_lossy(&r.body),
        gw.log_text()
    );
    let h = &r.json()["headers"];
    assert_eq!(h["x-client-tier"], "gold");
    assert_eq!(h["x-client-consumer"], alice["id"]);
    assert_eq!(h["x-clients"], "2", "each() walks every page");
    assert_eq!(h["x-same"], "true");
    assert!(
        h["x-write"]
            .as_str()
            .unwrap()
            .contains("kong.db.api_clients:upsert is not implemented by Turnpike"),
        "{h}"
    );
    // The schema's default.
    assert_eq!(
        as_client(Some("app-2")).await.json()["headers"]["x-client-tier"],
        "free"
    );
    // Writes on a DB-less node: Kong's answer.
    let r = call(gw.proxy, "GET", "/c", &[("x-register", "app-9")]).await;
    assert_eq!(
        (r.status, r.json()),
        (
            400,
            json!({"message": "[off] cannot create 'api_clients' entities when not using a database"})
        )
    );
    assert_eq!(as_client(Some("app-3")).await.status, 403);
    assert_eq!(as_client(None).await.status, 401);
    // The Admin API: the collection, by endpoint key, nested under the consumer.
    let all = gw.admin("GET", "/api-clients", None).await.json();
    assert_eq!(all["data"].as_array().unwrap().len(), 2, "{all}");
    let one = gw.admin("GET", "/api-clients/app-1", None).await;
    assert_eq!(one.status, 200);
    assert_eq!(one.json()["tier"], "gold");
    assert_eq!(one.json()["consumer"]["id"], alice["id"]);
    let nested = gw
        .admin("GET", "/consumers/alice/api-client", None)
        .await
        .json();
    assert_eq!(nested["data"].as_array().unwrap().len(), 2, "{nested}");
    let none = gw
        .admin("GET", "/consumers/bob/api-client", None)
        .await
        .json();
    assert_eq!(none["data"].as_array().unwrap().len(), 0, "{none}");
    // A declarative file breaking the entity's schema is refused whole, in Kong's shape.
    let bad = format!(
        r#"{{"_format_version": "3.0", "consumers": [{{"username": "a", "api_clients": [{{"client_name": "x", "tier": "platinum"}}]}}], "services": [{{"name": "s", "url": "{}"}}]}}"#,
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
    assert!(
        String::from_utf8_lossy(&r.body).contains("expected one of: free, gold"),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(
        as_client(Some("app-1")).await.status,
        200,
        "the running config is kept"
    );
    // The plugin's own endpoint (api.lua): its `before`, its handler reading kong.db, the
    // query's arguments in self.params, a helper Turnpike has not, an undeclared method.
    let r = call(
        gw.admin,
        "GET",
        "/api-clients-report/gold?limit=5",
        &[("x-operator", "ops")],
    )
    .await;
    assert_eq!(
        r.status,
        200,
        "{}\n{}",
        String::from_utf8_lossy(&r.body),
        gw.log_text()
    );
    assert_eq!(
        r.json(),
        json!({"tier": "gold", "clients": ["app-1"], "limit": 5, "asked_by": "ops"})
    );
    let r = gw.admin("GET", "/api-clients-report/silver", None).await;
    assert_eq!(
        (r.status, r.json()),
        (400, json!({"message": "unknown tier silver"}))
    );
    let r = gw.admin("DELETE", "/api-clients-report/gold", None).await;
    assert_eq!(r.status, 500);
    assert!(
        gw.log_text()
            .contains("kong.api.endpoints.delete_entity_endpoint is not implemented by Turnpike"),
        "{}",
        gw.log_text()
    );
    assert_eq!(
        gw.admin("PUT", "/api-clients-report/gold", None)
            .await
            .status,
        405
    );
    let listed = gw.admin("GET", "/endpoints", None).await.json();
    assert!(
        listed["data"]
            .as_array()
            .unwrap()
            .contains(&json!("/api-clients-report/{tier}")),
        "{listed}"
    );
}

/// Kong's own plugin with Admin API endpoints (`admin-api-method`), as Kong's
/// `13-plugin-endpoints_spec.lua` drives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kongs_plugin_endpoints_spec_cases_pass() {
    let tmp = tempfile::tempdir().unwrap();
    let root = "spec/fixtures/custom_plugins/kong/plugins/admin-api-method";
    let files = [
        (
            format!("{root}/handler.lua"),
            "kong/plugins/admin-api-method/handler.lua",
        ),
        (
            format!("{root}/schema.lua"),
            "kong/plugins/admin-api-method/schema.lua",
        ),
        (
            format!("{root}/api.lua"),
            "kong/plugins/admin-api-method/api.lua",
        ),
    ];
    let files: Vec<(&str, &str)> = files.iter().map(|(a, b)| (a.as_str(), *b)).collect();
    let Some(path) = plugins_from_mirror_files("Kong+kong", "3.9.1", &files, tmp.path()) else {
        eprintln!("skipped: no mirror of github.com/Kong/kong here (fetch github:Kong/kong)");
        return;
    };
    let gw = with_plugin(
        "_format_version: \"3.0\"\nplugins:\n- name: admin-api-method\n",
        "admin-api-method",
        &format!("{path};;"),
    );
    // "a method without an explicit exit does not add Lapis output"
    let r = admin_raw(
        gw.admin,
        "GET",
        "/method_without_exit",
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", gw.log_text());
    assert_eq!(r.body, b"hello".as_slice());
    // "nested parameters can be parsed correctly when using form-urlencoded requests"
    let r = admin_raw(
        gw.admin,
        "POST",
        "/parsed_params",
        "application/x-www-form-urlencoded",
        b"items%5B1%5D=foo&items%5B2%5D=bar".to_vec(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        r#"{"items":["foo","bar"]}"#
    );
}

/// The same entity in a database: written through the Admin API (nested and top-level, with
/// the schema's checks), read by the plugin once the change arrives, deleted with its consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugins_own_entity_lives_in_the_database() {
    let up = Upstream::start("clients-db");
    let gw = Gateway::sqlite()
        .env("TURNPIKE_PLUGINS", "bundled,api-clients")
        .env("TURNPIKE_LUA_PACKAGE_PATH", &package_path())
        .start();
    let post = |path: &'static str, body: serde_json::Value| gw.admin("POST", path, Some(body));
    seed_clients_route(&gw, &up, "bob", "/routes/r/plugins").await;
    let r = post(
        "/consumers/bob/api-client",
        json!({"client_name": "b-1", "tier": "gold"}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let created = r.json();
    assert_eq!(created["tier"], "gold");
    // Kong's schema violation for a value outside one_of.
    let r = post(
        "/consumers/bob/api-client",
        json!({"client_name": "b-2", "tier": "platinum"}),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["name"], "schema violation", "{}", r.json());
    assert_eq!(r.json()["fields"]["tier"], "expected one of: free, gold");
    // Unique: the same name twice.
    let bob = gw.admin("GET", "/consumers/bob", None).await.json();
    let r = post(
        "/api-clients",
        json!({"client_name": "b-1", "consumer": {"id": bob["id"]}}),
    )
    .await;
    assert_eq!(r.status, 409, "{}", String::from_utf8_lossy(&r.body));
    let r = post(
        "/api-clients",
        json!({"client_name": "b-3", "consumer": {"id": bob["id"]}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["tier"], "free");
    // The plugin reads what was written, once the node has the change.
    let seen = eventually(std::time::Duration::from_secs(10), async || {
        let r = call(gw.proxy, "GET", "/c", &[("x-client", "b-3")]).await;
        r.status == 200 && r.json()["headers"]["x-clients"] == "2"
    })
    .await;
    assert!(seen, "{}", gw.log_text());
    // The plugin writes its own entities (kong.db insert, update_by_, delete_by_), checked as
    // an Admin API write is.
    let plugin_call = |k: &'static str, v: &'static str| {
        let mut r = req("GET", "/c").header(k, v);
        if k == "x-register" {
            r = r.header("x-consumer-id", bob["id"].as_str().unwrap());
        }
        send(
            gw.proxy,
            r.body(http_body_util::Empty::<bytes::Bytes>::new())
                .unwrap(),
        )
    };
    let r = plugin_call("x-register", "b-4").await;
    assert_eq!(
        r.status,
        201,
        "{}\n{}",
        String::from_utf8_lossy(&r.body),
        gw.log_text()
    );
    assert_eq!(r.json()["tier"], "free");
    let stored = gw.admin("GET", "/api-clients/b-4", None).await;
    assert_eq!(
        (stored.status, &stored.json()["id"]),
        (200, &r.json()["id"])
    );
    let r = plugin_call("x-register", "b-4").await;
    assert_eq!(r.status, 400, "a second b-4 breaks the unique name");
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains("client_name"),
        "{}",
        r.json()
    );
    let r = plugin_call("x-promote", "b-4").await;
    assert_eq!(
        (r.status, &r.json()["tier"]),
        (200, &json!("gold")),
        "{}",
        r.json()
    );
    assert_eq!(
        gw.admin("GET", "/api-clients/b-4", None).await.json()["tier"],
        "gold"
    );
    assert_eq!(plugin_call("x-drop", "b-4").await.status, 204);
    assert_eq!(gw.admin("GET", "/api-clients/b-4", None).await.status, 404);
    let r = gw
        .admin("PATCH", "/api-clients/b-1", Some(json!({"tier": "free"})))
        .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["id"], created["id"]);
    // Deleting the consumer deletes its clients (on_delete = cascade).
    assert_eq!(gw.admin("DELETE", "/consumers/bob", None).await.status, 204);
    let all = gw.admin("GET", "/api-clients", None).await.json();
    assert_eq!(all["data"].as_array().unwrap().len(), 0, "{all}");
}

/// The plugin added to a PostgreSQL site as in Kong: `migrations up` makes its table, then two
/// nodes share its entities: one written on node A is read by the plugin on node B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugins_own_entity_is_shared_through_postgres() {
    use crate::common::pg::Postgres;
    let up = Upstream::start("clients-pg");
    let pg = Postgres::start();
    let base: Vec<(&str, String)> = pg.env();
    let path = package_path();
    let mut env: Vec<(&str, &str)> = base.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (ok, out) = run(&["migrations", "bootstrap"], &env);
    assert!(ok, "{out}");
    env.push(("TURNPIKE_PLUGINS", "bundled,api-clients"));
    env.push(("TURNPIKE_LUA_PACKAGE_PATH", &path));
    // The plugin's table is pending: a node will not start until it is made.
    let (ok, out) = run(&["migrations", "status"], &env);
    assert!(ok && out.contains("api_clients"), "{out}");
    let prefix = pg.dir().join("prefix-pending");
    let (proxy, admin) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let mut start_env = env.clone();
    start_env.push(("TURNPIKE_PREFIX", prefix.to_str().unwrap()));
    start_env.push(("TURNPIKE_PROXY_LISTEN", &proxy));
    start_env.push(("TURNPIKE_ADMIN_LISTEN", &admin));
    let (ok, out) = run(&["start"], &start_env);
    assert!(!ok && out.contains("run 'turnpike migrations up'"), "{out}");
    let (ok, out) = run(&["migrations", "up"], &env);
    assert!(
        ok && out.contains("made the tables of enabled plugins: api_clients"),
        "{out}"
    );
    let node = || {
        let mut b = Gateway::with_config("_format_version: \"3.0\"\n");
        for (k, v) in &env {
            b = b.env(k, v);
        }
        b.start()
    };
    let (a, b) = (node(), node());
    let post = |path: &'static str, body: serde_json::Value| a.admin("POST", path, Some(body));
    seed_clients_route(&a, &up, "carol", "/plugins").await;
    let r = post(
        "/consumers/carol/api-client",
        json!({"client_name": "c-1", "tier": "gold"}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let seen = eventually(std::time::Duration::from_secs(10), async || {
        let r = call(b.proxy, "GET", "/c", &[("x-client", "c-1")]).await;
        r.status == 200 && r.json()["headers"]["x-client-tier"] == "gold"
    })
    .await;
    assert!(seen, "{}", b.log_text());
    assert_eq!(
        b.admin("GET", "/api-clients/c-1", None).await.json()["tier"],
        "gold"
    );
}

/// OpenResty's `resty.redis` (from its repository, unchanged) over our cosockets: a plugin
/// counting calls in a real Redis, plain and over TLS, pipelined, its connections kept per
/// worker; Redis down is the plugin's own error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resty_redis_runs_over_cosockets() {
    use crate::common::redis::Redis;
    let tmp = tempfile::tempdir().unwrap();
    let Some(lib) = plugins_from_mirror_files(
        "openresty+lua-resty-redis",
        "HEAD",
        &[("lib/resty/redis.lua", "resty/redis.lua")],
        tmp.path(),
    ) else {
        eprintln!("skipped: no mirror of github.com/openresty/lua-resty-redis here");
        return;
    };
    let mut plain = Redis::start();
    let tls = Redis::start_tls();
    let up = Upstream::start("counted");
    let gw = with_plugin(
        &format!(
            r#"_format_version: "3.0"
services:
- name: s
  url: {}
  routes:
  - name: plain
    paths: [/plain]
    plugins:
    - name: redis-counter
      config: {{port: {}}}
  - name: tls
    paths: [/tls]
    plugins:
    - name: redis-counter
      config: {{port: {}, ssl: true, limit: 100}}
"#,
            up.url(),
            plain.port,
            tls.port
        ),
        "redis-counter",
        &format!("{lib};{}", package_path()),
    );
    let call = |path: &'static str, user: &'static str| {
        send(
            gw.proxy,
            req("GET", path)
                .header("x-user", user)
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .unwrap(),
        )
    };
    let mut reused = Vec::new();
    for n in 1..=3 {
        let r = call("/plain", "u1").await;
        assert_eq!(
            r.status,
            200,
            "{}\n{}",
            String::from_utf8_lossy(&r.body),
            gw.log_text()
        );
        let h = &r.json()["headers"];
        assert_eq!(h["x-hits"], n.to_string());
        assert_eq!(h["x-pipelined"], n.to_string(), "the pipeline's GET");
        reused.push(h["x-reused"].as_str().unwrap().parse::<u32>().unwrap());
    }
    // Two workers, three requests: one worker served two, the second on a kept connection.
    assert!(reused.iter().any(|r| *r > 0), "{reused:?}");
    let r = call("/plain", "u1").await;
    assert_eq!(r.status, 429);
    assert_eq!(r.json()["message"], "over 3");
    assert_eq!(
        plain.command(&["GET", "hits:u1"]).as_deref(),
        Some("$1\r\n4\r\n")
    );
    // Over TLS.
    let r = call("/tls", "u2").await;
    assert_eq!(
        r.status,
        200,
        "{}\n{}",
        String::from_utf8_lossy(&r.body),
        gw.log_text()
    );
    assert_eq!(r.json()["headers"]["x-hits"], "1");
    // Redis gone: the kept connections fail and new ones are refused; the plugin answers.
    plain.kill();
    let r = call("/plain", "u3").await;
    assert_eq!(r.status, 500);
    let message = r.json()["message"].as_str().unwrap().to_string();
    assert!(
        message.starts_with("redis: ") || message.starts_with("incr: "),
        "{message}"
    );
}

/// Copies files of a mirrored repository (`(path in the repository, path under into)`) and
/// gives the package path for them, or None without the mirror.
fn plugins_from_mirror_files(
    repo: &str,
    rev: &str,
    files: &[(&str, &str)],
    into: &std::path::Path,
) -> Option<String> {
    let mirrors = std::env::var("TURNPIKE_TEST_MIRRORS").unwrap_or_else(|_| "/work/.mirror".into());
    let git_dir = std::path::Path::new(&mirrors).join(repo).join("repo");
    for (from, to) in files {
        let out = std::process::Command::new("git")
            .arg("--git-dir")
            .arg(&git_dir)
            .arg("show")
            .arg(format!("{rev}:{from}"))
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        let dest = into.join(to);
        std::fs::create_dir_all(dest.parent()?).ok()?;
        std::fs::write(dest, out.stdout).ok()?;
    }
    Some(format!("{}/?.lua", into.display()))
}

/// A plugin that never gives its worker back is stopped after `lua_time_budget`: the request
/// gets Kong's 500, the log names the plugin, and the same worker serves the next requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runaway_plugin_is_stopped_by_the_time_budget() {
    let up = Upstream::start("budget");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: s
  url: {}
  routes:
  - name: loop
    paths: [/loop]
    plugins:
    - name: pre-function
      config:
        access:
        - "local n = 0 while true do n = n + 1 end"
  - name: ok
    paths: [/ok]
"#,
        up.url()
    ))
    .env("TURNPIKE_LUA_TIME_BUDGET", "0.5")
    .env("TURNPIKE_NGINX_WORKER_PROCESSES", "1")
    .start();
    let r = get(gw.proxy, "x", "/loop").await;
    assert_eq!(r.status, 500, "{}", gw.log_text());
    assert_eq!(r.json(), json!({"message": "An unexpected error occurred"}));
    assert!(
        gw.log_text().contains("[pre-function] access")
            && gw.log_text().contains("time budget (lua_time_budget)"),
        "{}",
        gw.log_text()
    );
    // One worker: it is free again.
    assert_eq!(get(gw.proxy, "x", "/ok").await.status, 200);
    assert_eq!(get(gw.proxy, "x", "/loop").await.status, 500);
    // A value that is not a number of seconds stops the start, naming the property.
    let (ok, out) = run(
        &["start"],
        &[
            ("TURNPIKE_LUA_TIME_BUDGET", "soon"),
            ("TURNPIKE_PREFIX", "/tmp/turnpike-budget-bad"),
        ],
    );
    assert!(!ok && out.contains("lua_time_budget"), "{out}");
}

/// Through the Admin API: the consumer `consumer`, a service to `up` with the route `/c`, and
/// the api-clients plugin posted at `plugins_path` (on the route, or global).
async fn seed_clients_route(gw: &Gateway, up: &Upstream, consumer: &str, plugins_path: &str) {
    for (path, body) in [
        ("/consumers", json!({"username": consumer})),
        ("/services", json!({"name": "s", "url": up.url()})),
        ("/services/s/routes", json!({"name": "r", "paths": ["/c"]})),
        (plugins_path, json!({"name": "api-clients"})),
    ] {
        let r = gw.admin("POST", path, Some(body)).await;
        assert_eq!(
            r.status,
            201,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
}

/// Cosockets called directly (no client library): a plugin speaking Redis's protocol over
/// `ngx.socket.tcp` to a real Redis, plain and over TLS: sends of strings and nested tables,
/// receives by line, by count and of what is there, keepalive pools, and a closed socket's
/// answer; a peer that is gone is the plugin's own error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cosockets_speak_to_a_real_server() {
    use crate::common::redis::Redis;
    let mut plain = Redis::start();
    let tls = Redis::start_tls();
    let up = Upstream::start("raw");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: s
  url: {}
  routes:
  - name: plain
    paths: [/plain]
    plugins:
    - name: raw-redis
      config: {{port: {}}}
  - name: tls
    paths: [/tls]
    plugins:
    - name: raw-redis
      config: {{port: {}, ssl: true}}
"#,
        up.url(),
        plain.port,
        tls.port
    ))
    .env("TURNPIKE_PLUGINS", "bundled,raw-redis")
    .env("TURNPIKE_LUA_PACKAGE_PATH", &package_path())
    .env("TURNPIKE_NGINX_WORKER_PROCESSES", "1")
    .start();
    for (n, path) in [(1, "/plain"), (2, "/plain"), (1, "/tls")] {
        let r = get(gw.proxy, "x", path).await;
        assert_eq!(
            r.status,
            200,
            "{}\n{}",
            String::from_utf8_lossy(&r.body),
            gw.log_text()
        );
        let h = &r.json()["headers"];
        assert_eq!(h["x-incr"], format!(":{n}"), "{h}");
        assert_eq!(h["x-pong"], "+PONG");
        assert_eq!(h["x-set"], "+OK");
        assert_eq!(h["x-get"], "$5 hello 2", "{h}");
        assert_eq!(h["x-sent"], "27", "the nested pieces sent as one");
        assert_eq!(h["x-after"], "closed");
        // One worker: the second plain call reused the first's connection.
        let reused = if (n, path) == (2, "/plain") { "1" } else { "0" };
        assert_eq!(h["x-reused"], reused, "{path} #{n}: {h}");
    }
    plain.kill();
    let r = get(gw.proxy, "x", "/plain").await;
    assert_eq!(r.status, 502);
    let message = r.json()["message"].as_str().unwrap().to_string();
    // A kept connection to the dead server fails at its first read; a new one is refused.
    assert!(
        message.starts_with("connect: connection refused")
            || message.starts_with("send: ")
            || message == "incr: closed",
        "{message}"
    );
}
