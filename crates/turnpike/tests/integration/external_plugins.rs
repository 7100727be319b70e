//! External plugins, as Kong runs them: a plugin server written with one of Kong's PDKs (here
//! the Python PDK, `kong-pdk` from PyPI), named in `pluginserver_names`, queried for its
//! plugin at start, started and supervised by the gateway, and spoken to over its Unix socket
//! for each phase the plugin has, its PDK calls answered by the gateway.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::json;

use crate::common::*;

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/integration/pluginservers")
        .join(name)
        .display()
        .to_string()
}

/// `PYTHONPATH` for a Python with Kong's Python PDK: the system's when it has it, else the PDK
/// installed from PyPI into the target directory, once.
fn python_path() -> &'static str {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| python_with("kong_pdk", "kong-pdk", "python-kong-pdk"))
}

/// The gateway's environment for the Python fixture `py-greeter`: its server's socket in
/// `dir`, started and queried as Kong's documentation has it.
pub(crate) fn py_greeter_env(dir: &Path) -> Vec<(String, String)> {
    let script = fixture("py-greeter.py");
    let pp = python_path();
    vec![
        ("TURNPIKE_PLUGINS".into(), "bundled,py-greeter".into()),
        ("TURNPIKE_PLUGINSERVER_NAMES".into(), "py-greeter".into()),
        (
            "TURNPIKE_PLUGINSERVER_PY_GREETER_SOCKET".into(),
            dir.join("py-greeter.sock").display().to_string(),
        ),
        (
            "TURNPIKE_PLUGINSERVER_PY_GREETER_START_CMD".into(),
            format!("env PYTHONPATH={pp} python3 {script} -p {}", dir.display()),
        ),
        (
            "TURNPIKE_PLUGINSERVER_PY_GREETER_QUERY_CMD".into(),
            format!("env PYTHONPATH={pp} python3 {script} --dump"),
        ),
    ]
}

/// A GET with these headers (a Host of its own when they name one).
async fn fetch(addr: std::net::SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut b = http::Request::builder().method("GET").uri(path);
    if !headers.iter().any(|(k, _)| *k == "host") {
        b = b.header("host", "localhost");
    }
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    send(
        addr,
        b.body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_pdk_plugin_runs_in_its_own_server() {
    let up = Upstream::start("py");
    let dir = tempfile::tempdir().unwrap();
    let log_file = dir.path().join("py-log.txt");
    let doc = format!(
        r#"_format_version: "3.0"
consumers:
- username: grace
  id: 6a1f0c3e-2d4b-4f5a-8b7c-9d0e1f2a3b4c
services:
- name: s
  url: {}
  routes:
  - name: r
    paths: [/py]
    plugins:
    - name: py-greeter
      config: {{message: bonjour, log_file: {}}}
  - name: plain
    paths: [/plain]
"#,
        up.url(),
        log_file.display()
    );
    let mut builder = Gateway::with_config(&doc);
    for (k, v) in py_greeter_env(dir.path()) {
        builder = builder.env(&k, &v);
    }
    let gw = builder.start();

    // The access phase: the plugin reads the request through the PDK and sets upstream and
    // response headers; a header is a list of values, as Kong's PDK hands it over.
    let r = fetch(
        gw.proxy,
        "/py/a",
        &[("host", "greeted.test"), ("x-multi", "1"), ("x-multi", "2")],
    )
    .await;
    assert_eq!(
        r.status,
        200,
        "{}\n{}",
        String::from_utf8_lossy(&r.body),
        gw.log_text()
    );
    let seen = r.json()["headers"].clone();
    assert_eq!(seen["x-py-greeting"], "bonjour greeted.test", "{seen}");
    assert_eq!(seen["x-py-multi"], "1,2", "{seen}");
    assert_eq!(
        seen["x-py-consumer"], "6a1f0c3e-2d4b-4f5a-8b7c-9d0e1f2a3b4c",
        "kong.client.load_consumer: {seen}"
    );
    assert_eq!(r.header("x-py-path"), Some("/py/a"));
    // A PDK function the gateway lacks is an error naming it, which the plugin sees.
    assert!(
        seen["x-py-missing"]
            .as_str()
            .is_some_and(|e| e.contains("kong.node.get_memory_stats")),
        "{seen}"
    );
    // The response phase: the upstream's body read whole, its length told to the client,
    // and an upstream's 418 replaced by the plugin's own answer.
    assert_eq!(
        r.header("x-py-upstream-bytes"),
        Some(r.body.len().to_string().as_str()),
        "{}",
        gw.log_text()
    );
    let r = fetch(gw.proxy, "/py/status/418", &[]).await;
    assert_eq!(
        (r.status, r.json()),
        (200, json!({"message": "tea replaced by py-greeter"})),
        "{}",
        gw.log_text()
    );
    // kong.response.exit: the plugin's answer, with its status, body and headers.
    let r = fetch(gw.proxy, "/py/b", &[("x-deny", "yes")]).await;
    assert_eq!(
        (r.status, r.json()),
        (403, json!({"message": "denied by py-greeter"}))
    );
    assert_eq!(r.header("x-py"), Some("denied"));
    // Other routes do not reach the server.
    let r = get(gw.proxy, "x", "/plain").await;
    assert_eq!(r.status, 200);
    assert!(r.json()["headers"].get("x-py-greeting").is_none());

    // The log phase, after the response: Kong's serialized entry, the status and the request's
    // headers, as the request left them.
    let logged = async || std::fs::read_to_string(&log_file).unwrap_or_default();
    assert!(
        eventually(Duration::from_secs(10), async || logged()
            .await
            .lines()
            .count()
            >= 3)
        .await,
        "{}\n{}",
        logged().await,
        gw.log_text()
    );
    let text = logged().await;
    let first = text.lines().next().unwrap();
    let (status, rest) = first.split_once(' ').unwrap();
    assert_eq!(status, "200", "{first}");
    let (_, entry) = rest.split_once(' ').unwrap();
    let entry: serde_json::Value = serde_json::from_str(entry).unwrap();
    assert_eq!(entry["request"]["uri"], "/py/a", "{entry}");
    assert_eq!(entry["response"]["status"], 200, "{entry}");
    assert!(text.lines().any(|l| l.starts_with("403 ")), "{text}");

    // The Admin API sees the plugin as a bundled one: enabled, its schema from the server's
    // dump, its config checked and defaulted by it.
    let enabled = gw.admin("GET", "/plugins/enabled", None).await.json();
    assert!(enabled["enabled_plugins"]
        .as_array()
        .unwrap()
        .contains(&json!("py-greeter")));
    let schema = gw
        .admin("GET", "/schemas/plugins/py-greeter", None)
        .await
        .json()
        .to_string();
    assert!(schema.contains("\"deny_header\""), "{schema}");
    let bad = json!({"_format_version": "3.0", "plugins": [
        {"name": "py-greeter", "config": {"message": 12}}]});
    let r = gw.admin("POST", "/config", Some(bad)).await;
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        String::from_utf8_lossy(&r.body).contains("expected a string"),
        "{}",
        String::from_utf8_lossy(&r.body)
    );

    // A new config of the plugin is a new instance on the server, with that config.
    let doc2 = doc.replace("message: bonjour", "message: salut");
    let r = admin_raw(
        gw.admin,
        "POST",
        "/config",
        "text/yaml",
        doc2.as_bytes().to_vec(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let r = fetch(gw.proxy, "/py/c", &[("host", "h")]).await;
    assert_eq!(r.json()["headers"]["x-py-greeting"], "salut h");

    // The server dies: the gateway starts it again, and the plugin's instance with it.
    let pids = String::from_utf8(
        Command::new("pgrep")
            .args(["-f", "py-greeter.py -p"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(!pids.trim().is_empty(), "{}", gw.log_text());
    for pid in pids.split_whitespace() {
        let _ = Command::new("kill").args(["-9", pid]).status();
    }
    let back = eventually(Duration::from_secs(15), async || {
        let r = fetch(gw.proxy, "/py/d", &[("host", "h")]).await;
        r.json()["headers"]["x-py-greeting"] == "salut h"
    })
    .await;
    assert!(back, "{}", gw.log_text());
    assert!(
        gw.log_text().contains("[py-greeter:"),
        "the server's output is logged with its name and pid: {}",
        gw.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_plugin_runs_in_the_rewrite_phase_when_global() {
    let up = Upstream::start("py-rewrite");
    let dir = tempfile::tempdir().unwrap();
    let doc = format!(
        r#"_format_version: "3.0"
plugins:
- name: py-greeter
  config: {{message: global}}
services:
- name: s
  url: {}
  routes:
  - name: r
    paths: [/any]
"#,
        up.url()
    );
    let mut builder = Gateway::with_config(&doc);
    for (k, v) in py_greeter_env(dir.path()) {
        builder = builder.env(&k, &v);
    }
    let gw = builder.start();
    let r = fetch(gw.proxy, "/any/x", &[("host", "g.test")]).await;
    assert_eq!(
        r.status,
        200,
        "{}\n{}",
        String::from_utf8_lossy(&r.body),
        gw.log_text()
    );
    let seen = r.json()["headers"].clone();
    assert_eq!(seen["x-py-rewrite"], "before routing", "{seen}");
    assert_eq!(seen["x-py-greeting"], "global g.test", "{seen}");
    // The phase waits on the plugin server for a request that matches no route, too.
    let r = fetch(gw.proxy, "/nowhere", &[]).await;
    assert_eq!(r.status, 404);
}

#[test]
fn a_plugin_server_without_a_query_command_stops_the_node_with_kongs_message() {
    let (ok, out) = run(
        &["start"],
        &[
            ("TURNPIKE_PLUGINSERVER_NAMES", "nowhere-plugin"),
            ("TURNPIKE_DATABASE", "off"),
        ],
    );
    assert!(!ok);
    assert!(
        out.contains("query_command undefined for pluginserver nowhere-plugin"),
        "{out}"
    );
}

/// Kong's JavaScript PDK (npm `kong-pdk`, with its `kong-js-pluginserver`), installed from
/// the npm registry into the target directory once; the path of the server's script.
fn js_pluginserver() -> String {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| {
        node_modules_with("js-kong-pdk", &["kong-pdk@0.6.0"])
            .join("kong-pdk/bin/kong-js-pluginserver")
            .display()
            .to_string()
    })
    .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_javascript_pdk_plugin_runs_in_kongs_js_pluginserver() {
    let up = Upstream::start("js");
    let dir = tempfile::tempdir().unwrap();
    let server = js_pluginserver();
    let plugins = fixture("js");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: s
  url: {}
  routes:
  - name: r
    paths: [/js]
    plugins:
    - name: js-greeter
      config: {{message: hola}}
"#,
        up.url()
    ))
    .env("TURNPIKE_PLUGINS", "bundled,js-greeter")
    .env("TURNPIKE_PLUGINSERVER_NAMES", "js")
    .env(
        "TURNPIKE_PLUGINSERVER_JS_SOCKET",
        &dir.path().join("js.sock").display().to_string(),
    )
    .env(
        "TURNPIKE_PLUGINSERVER_JS_START_CMD",
        &format!(
            "node {server} -d {plugins} -p {} --sock-name js.sock",
            dir.path().display()
        ),
    )
    .env(
        "TURNPIKE_PLUGINSERVER_JS_QUERY_CMD",
        &format!("node {server} -d {plugins} --dump-all-plugins"),
    )
    .start();

    let r = fetch(gw.proxy, "/js/x?a=1&a=2&b=3", &[("host", "js.test")]).await;
    assert_eq!(
        r.status,
        200,
        "{}\n{}",
        String::from_utf8_lossy(&r.body),
        gw.log_text()
    );
    let seen = r.json()["headers"].clone();
    assert_eq!(seen["x-js-greeting"], "hola js.test", "{seen}");
    // The query as the PDK's multimap: every value a list.
    let query: serde_json::Value =
        serde_json::from_str(seen["x-js-query"].as_str().unwrap()).unwrap();
    assert_eq!(query, json!({"a": ["1", "2"], "b": ["3"]}));
    assert_eq!(r.header("x-js-method"), Some("GET"));
    assert!(
        seen["x-js-missing"]
            .as_str()
            .is_some_and(|e| e.contains("kong.node.get_memory_stats")),
        "{seen}"
    );
    let r = fetch(gw.proxy, "/js/x", &[("x-deny", "1")]).await;
    assert_eq!(
        (r.status, r.json()),
        (451, json!({"message": "denied by js-greeter"}))
    );
    assert_eq!(r.header("x-js"), Some("denied"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_pdk_plugin_runs_over_kongs_protobuf_protocol() {
    // The Go PDK's embedded server names its plugin and socket after its executable.
    let bin = go_build("pluginservers/go-greeter", "go-greeter");
    let up = Upstream::start("go");
    let dir = tempfile::tempdir().unwrap();
    let log_file = dir.path().join("go-log.txt");
    let doc = format!(
        r#"_format_version: "3.0"
services:
- name: s
  url: {}
  routes:
  - name: r
    paths: [/go]
    plugins:
    - name: go-greeter
      config: {{message: ciao, times: 2, log_file: {}}}
"#,
        up.url(),
        log_file.display()
    );
    let gw = Gateway::with_config(&doc)
        .env("TURNPIKE_PLUGINS", "bundled,go-greeter")
        .env("TURNPIKE_PLUGINSERVER_NAMES", "go-greeter")
        .env(
            "TURNPIKE_PLUGINSERVER_GO_GREETER_SOCKET",
            &dir.path().join("go-greeter.socket").display().to_string(),
        )
        .env(
            "TURNPIKE_PLUGINSERVER_GO_GREETER_START_CMD",
            &format!("{} -kong-prefix {}", bin.display(), dir.path().display()),
        )
        .env(
            "TURNPIKE_PLUGINSERVER_GO_GREETER_QUERY_CMD",
            &format!("{} -dump", bin.display()),
        )
        .start();

    let r = fetch(
        gw.proxy,
        "/go/a",
        &[("host", "go.test"), ("x-multi", "1"), ("x-multi", "2")],
    )
    .await;
    assert_eq!(
        r.status,
        200,
        "{}\n{}",
        String::from_utf8_lossy(&r.body),
        gw.log_text()
    );
    let seen = r.json()["headers"].clone();
    assert_eq!(seen["x-go-greeting"], "ciao ciao go.test", "{seen}");
    assert_eq!(seen["x-go-multi"], "1,2", "{seen}");
    assert_eq!(seen["x-go-port"], gw.proxy.port().to_string(), "{seen}");
    assert_eq!(seen["x-go-shared"], "yes", "{seen}");
    assert_eq!(r.header("x-go-method"), Some("GET"));
    // kong.Response.Exit: status, body and headers from the Go side.
    let r = fetch(gw.proxy, "/go/b", &[("x-deny", "1")]).await;
    assert_eq!(
        (r.status, r.json()),
        (402, json!({"message": "denied by go-greeter"}))
    );
    assert_eq!(r.header("x-go"), Some("denied"));
    // The connection an exit left behind is not reused: the next request is served.
    let r = fetch(gw.proxy, "/go/c", &[("host", "h")]).await;
    assert_eq!(r.json()["headers"]["x-go-greeting"], "ciao ciao h");
    // The log phase: the serialized entry and the status.
    assert!(
        eventually(Duration::from_secs(10), async || {
            std::fs::read_to_string(&log_file)
                .unwrap_or_default()
                .lines()
                .count()
                >= 3
        })
        .await,
        "{}",
        gw.log_text()
    );
    let text = std::fs::read_to_string(&log_file).unwrap();
    let statuses: Vec<&str> = text.lines().map(|l| &l[..3]).collect();
    assert!(
        statuses.contains(&"402") && statuses.contains(&"200"),
        "{text}"
    );
    let (_, entry) = text.lines().next().unwrap().split_once(' ').unwrap();
    let entry: serde_json::Value = serde_json::from_str(entry).unwrap();
    assert!(
        entry["request"]["uri"]
            .as_str()
            .unwrap()
            .starts_with("/go/"),
        "{entry}"
    );
    // The schema the Go server derived from its Config struct.
    let schema = gw
        .admin("GET", "/schemas/plugins/go-greeter", None)
        .await
        .json()
        .to_string();
    assert!(schema.contains("\"times\""), "{schema}");
}
