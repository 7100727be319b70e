//! decK, Kong's declarative config tool, built from `../shared/tools/deck` (cached between
//! runs), against the real binary: the day-2 loop on SQLite and on PostgreSQL (ping, validate,
//! sync, an empty diff, a change synced and an empty diff again, dump and sync of the dump,
//! `--select-tag`, reset), and DB-less the render/POST /config/dump loop. Every command's exit
//! status and output are asserted.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::common::pg::Postgres;
use crate::common::*;
use serde_json::json;

/// The realistic kong.yml: services, routes, an upstream with targets and health checks,
/// consumers with key-auth, basic-auth and acl credentials, plugins at every scope.
pub(crate) const KONG_YML: &str = include_str!("deck-kong.yml");

pub(crate) fn deck() -> &'static Path {
    static DECK: OnceLock<PathBuf> = OnceLock::new();
    DECK.get_or_init(|| {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools/deck/build.sh");
        let out = Command::new("bash")
            .arg(&script)
            .output()
            .expect("run shared/tools/deck/build.sh");
        assert!(
            out.status.success(),
            "building decK failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .trim()
            .to_string();
        PathBuf::from(path)
    })
}

/// Runs decK against the gateway's Admin API; (success, stdout + stderr).
fn run_deck(gw: &Gateway, dir: &Path, args: &[&str]) -> (bool, String) {
    let addr = format!("http://{}", gw.admin);
    let mut all: Vec<&str> = args.to_vec();
    if args[0] == "gateway" {
        all.extend(["--kong-addr", &addr]);
    }
    let out = Command::new(deck())
        .args(&all)
        .current_dir(dir)
        .env("DECK_ANALYTICS", "off")
        .output()
        .expect("run deck");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

pub(crate) fn ok(gw: &Gateway, dir: &Path, args: &[&str]) -> String {
    let (success, out) = run_deck(gw, dir, args);
    assert!(success, "deck {args:?} failed:\n{out}");
    out
}

/// decK's summary counts: (created, updated, deleted).
pub(crate) fn summary(out: &str) -> (u32, u32, u32) {
    let count = |what: &str| {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(what))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no '{what}' in decK's output:\n{out}"))
    };
    (count("Created:"), count("Updated:"), count("Deleted:"))
}

async fn day_two(gw: &Gateway, dir: &Path, up: &Upstream) {
    let file = KONG_YML.replace("http://127.0.0.1:9/orders", &format!("{}/orders", up.url()));
    std::fs::write(dir.join("kong.yml"), &file).unwrap();
    let out = ok(gw, dir, &["gateway", "ping"]);
    assert!(out.contains("3.9.1"), "{out}");
    ok(gw, dir, &["gateway", "validate", "kong.yml"]);
    // First sync creates everything; a diff of the same file is empty.
    let out = ok(gw, dir, &["gateway", "sync", "kong.yml"]);
    assert_eq!(summary(&out), (24, 0, 0), "{out}");
    let out = ok(gw, dir, &["gateway", "diff", "kong.yml"]);
    assert_eq!(summary(&out), (0, 0, 0), "{out}");
    // The synced config serves traffic: key-auth with the file's key.
    let proxy = gw.proxy;
    until_status(proxy, "/orders", 401).await;
    let r = call(proxy, "GET", "/orders", &[("apikey", "alice-secret-key")]).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["headers"]["x-consumer-username"], "alice");
    // A change: a plugin's config, a target's weight, a key replaced.
    let changed = file
        .replace("minute: 100", "minute: 200")
        .replace("weight: 50", "weight: 60")
        .replace("bob-key", "bob-key-2");
    std::fs::write(dir.join("kong2.yml"), &changed).unwrap();
    let out = ok(gw, dir, &["gateway", "sync", "kong2.yml"]);
    assert_eq!(summary(&out), (1, 2, 1), "{out}");
    let out = ok(gw, dir, &["gateway", "diff", "kong2.yml"]);
    assert_eq!(summary(&out), (0, 0, 0), "{out}");
    let out = ok(gw, dir, &["gateway", "sync", "kong2.yml"]);
    assert_eq!(
        summary(&out),
        (0, 0, 0),
        "a second sync changes nothing: {out}"
    );
    // Dump, and sync of the dump: nothing to do.
    ok(gw, dir, &["gateway", "dump", "-o", "dump.yml", "--yes"]);
    let dump = std::fs::read_to_string(dir.join("dump.yml")).unwrap();
    assert!(
        dump.contains("bob-key-2") && dump.contains("billing-upstream"),
        "{dump}"
    );
    let out = ok(gw, dir, &["gateway", "sync", "dump.yml"]);
    assert_eq!(summary(&out), (0, 0, 0), "{out}");
    // --select-tag: a file managing only its tag's entities leaves the others alone.
    let team_c = "_format_version: \"3.0\"\n_info:\n  select_tags: [team-c]\nservices:\n- name: reports\n  url: http://127.0.0.1:9/reports\n  routes:\n  - name: reports-route\n    paths: [/reports]\n";
    std::fs::write(dir.join("team-c.yml"), team_c).unwrap();
    let out = ok(gw, dir, &["gateway", "sync", "team-c.yml"]);
    assert_eq!(summary(&out), (2, 0, 0), "{out}");
    let out = ok(gw, dir, &["gateway", "diff", "team-c.yml"]);
    assert_eq!(summary(&out), (0, 0, 0), "{out}");
    let services = gw.admin("GET", "/services?tags=team-c", None).await.json();
    assert_eq!(services["data"].as_array().unwrap().len(), 1, "{services}");
    let out = ok(
        gw,
        dir,
        &["gateway", "diff", "kong2.yml", "--select-tag", "team-c"],
    );
    assert!(summary(&out).0 > 0, "{out}");
    let all = gw.admin("GET", "/services", None).await.json();
    assert_eq!(all["data"].as_array().unwrap().len(), 3, "{all}");
    // Reset removes everything.
    ok(gw, dir, &["gateway", "reset", "--force"]);
    for path in [
        "/services",
        "/routes",
        "/consumers",
        "/upstreams",
        "/plugins",
    ] {
        let r = gw.admin("GET", path, None).await.json();
        assert_eq!(r["data"], json!([]), "{path}: {r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deck_day_two_on_sqlite() {
    let up = Upstream::start("deck-sqlite");
    let gw = Gateway::sqlite().start();
    let dir = tempfile::tempdir().unwrap();
    day_two(&gw, dir.path(), &up).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deck_day_two_on_postgres() {
    let up = Upstream::start("deck-pg");
    let pg = Postgres::start();
    let env: Vec<(&str, String)> = pg.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (success, out) = run(&["migrations", "bootstrap"], &env);
    assert!(success, "{out}");
    let mut b = Gateway::with_config("_format_version: \"3.0\"\n");
    for (k, v) in &env {
        b = b.env(k, v);
    }
    let gw = b.start();
    let dir = tempfile::tempdir().unwrap();
    day_two(&gw, dir.path(), &up).await;
}

/// DB-less, as with Kong: decK renders the file, it is POSTed to /config, and a dump of the
/// gateway gives back what was rendered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deck_render_and_dump_db_less() {
    let gw = Gateway::with_config("_format_version: \"3.0\"\n").start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("kong.yml"), KONG_YML).unwrap();
    ok(
        &gw,
        dir.path(),
        &[
            "file",
            "render",
            "kong.yml",
            "--format",
            "json",
            "-o",
            "rendered.json",
        ],
    );
    let rendered = std::fs::read_to_string(dir.path().join("rendered.json")).unwrap();
    let rendered_json: serde_json::Value = serde_json::from_str(&rendered).unwrap();
    let r = gw.admin("POST", "/config", Some(rendered_json)).await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    ok(
        &gw,
        dir.path(),
        &["gateway", "dump", "-o", "dump.yml", "--yes"],
    );
    // The dump is the same config: a diff of the rendered file against the gateway is empty
    // (decK's diff reads both; DB-less Kong answers it the same way).
    let out = ok(&gw, dir.path(), &["gateway", "diff", "rendered.json"]);
    assert_eq!(summary(&out), (0, 0, 0), "{out}");
    let dump = std::fs::read_to_string(dir.path().join("dump.yml")).unwrap();
    for name in [
        "orders",
        "billing-route",
        "billing-upstream",
        "alice",
        "alice-secret-key",
    ] {
        assert!(dump.contains(name), "{name} missing from the dump:\n{dump}");
    }
}

/// The routes of a decK file (top level and under services): name -> (expression, priority).
fn expression_routes(yaml: &str) -> std::collections::BTreeMap<String, (String, i64)> {
    let doc: serde_json::Value = serde_yaml::from_str(yaml).unwrap();
    let mut out = std::collections::BTreeMap::new();
    let mut routes: Vec<&serde_json::Value> =
        doc["routes"].as_array().into_iter().flatten().collect();
    for s in doc["services"].as_array().into_iter().flatten() {
        routes.extend(s["routes"].as_array().into_iter().flatten());
    }
    for r in routes {
        out.insert(
            r["name"].as_str().unwrap().to_string(),
            (
                r["expression"].as_str().unwrap_or_default().to_string(),
                r["priority"].as_i64().unwrap_or(0),
            ),
        );
    }
    out
}

/// decK's own fixtures with expressions routes (`deck-expressions/`) against a node on
/// `router_flavor = expressions`: sync, an empty diff, a dump with the same expressions and
/// priorities, and a sync of the dump that changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deck_syncs_expression_routes() {
    let gw = Gateway::sqlite()
        .env("TURNPIKE_ROUTER_FLAVOR", "expressions")
        .start();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    for (name, text, created) in [
        (
            "expression-routes.yaml",
            include_str!("deck-expressions/expression-routes.yaml"),
            2,
        ),
        (
            "route-expressions.yaml",
            include_str!("deck-expressions/route-expressions.yaml"),
            5,
        ),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
        ok(&gw, dir, &["gateway", "validate", name]);
        let out = ok(&gw, dir, &["gateway", "sync", name]);
        assert_eq!(summary(&out), (created, 0, 0), "{name}: {out}");
        let out = ok(&gw, dir, &["gateway", "diff", name]);
        assert_eq!(summary(&out), (0, 0, 0), "{name}: {out}");
        ok(&gw, dir, &["gateway", "dump", "-o", "dump.yml", "--yes"]);
        let dump = std::fs::read_to_string(dir.join("dump.yml")).unwrap();
        assert_eq!(
            expression_routes(&dump),
            expression_routes(text),
            "{name}: {dump}"
        );
        let out = ok(&gw, dir, &["gateway", "sync", "dump.yml"]);
        assert_eq!(summary(&out), (0, 0, 0), "{name}: {out}");
        ok(&gw, dir, &["gateway", "reset", "--force"]);
    }
}

/// decK syncs gRPC services and routes (Kong's grpc subschema: no strip_path or methods),
/// a grpc-web plugin and stream routes (tcp, tls_passthrough), its second diff is clean, the
/// dump syncs back unchanged, and a grpcio call goes through what it synced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deck_syncs_grpc_services() {
    let up = crate::grpc::GrpcServer::start("deck", None);
    let gw = Gateway::sqlite().start_h2();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let yaml = format!(
        r#"_format_version: "3.0"
services:
- name: greeter
  url: grpc://127.0.0.1:{port}
  retries: 2
  routes:
  - name: greeter-grpc
    protocols: [grpc, grpcs]
    hosts: [greeter.test]
    paths: [/echo.Echo/]
    plugins:
    - name: key-auth
      config:
        key_names: [apikey]
- name: secure
  url: grpcs://secure.internal:50052
  routes:
  - name: secure-sni
    protocols: [grpcs]
    snis: [secure.test]
- name: web
  url: grpc://127.0.0.1:{port}
  routes:
  - name: web-route
    protocols: [http, https]
    paths: [/web]
    plugins:
    - name: grpc-web
      config:
        pass_stripped_path: true
- name: database
  url: tcp://10.0.0.5:5432
  routes:
  - name: pg
    protocols: [tcp]
    destinations: [{{port: 5432}}]
  - name: pg-tls
    protocols: [tls_passthrough]
    snis: [db.test]
consumers:
- username: app
  keyauth_credentials:
  - key: app-key
"#,
        port = up.port
    );
    std::fs::write(dir.join("grpc.yaml"), &yaml).unwrap();
    ok(&gw, dir, &["gateway", "validate", "grpc.yaml"]);
    let out = ok(&gw, dir, &["gateway", "sync", "grpc.yaml"]);
    assert_eq!(summary(&out), (13, 0, 0), "{out}");
    let out = ok(&gw, dir, &["gateway", "diff", "grpc.yaml"]);
    assert_eq!(summary(&out), (0, 0, 0), "{out}");
    let r = gw.admin("GET", "/routes/greeter-grpc", None).await.json();
    assert_eq!(r["strip_path"], false, "{r}");
    ok(&gw, dir, &["gateway", "dump", "-o", "dump.yml", "--yes"]);
    let out = ok(&gw, dir, &["gateway", "sync", "dump.yml"]);
    assert_eq!(summary(&out), (0, 0, 0), "{out}");
    // What decK synced serves gRPC (the node applies it in the background).
    let target = gw.proxy.to_string();
    let call = json!([{"method": "/echo.Echo/Unary", "request": "d", "metadata": [["apikey", "app-key"]]}]);
    let mut last = Vec::new();
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            last = crate::grpc::grpc_calls(&target, call.clone(), &["--authority", "greeter.test"]);
            last[0]["responses"] == json!(["deck:d"])
        })
        .await,
        "{last:?}"
    );
    // A route decK would send with what Kong's grpc subschema refuses gets Kong's message.
    std::fs::write(
        dir.join("bad.yaml"),
        yaml.replace(
            "    paths: [/echo.Echo/]\n",
            "    paths: [/echo.Echo/]\n    strip_path: true\n",
        ),
    )
    .unwrap();
    let (success, out) = run_deck(&gw, dir, &["gateway", "sync", "bad.yaml"]);
    assert!(!success, "{out}");
    assert!(
        out.contains("cannot set 'strip_path' when 'protocols' is 'grpc' or 'grpcs'"),
        "{out}"
    );
}

/// decK manages an operator's own plugins as bundled ones: a Lua plugin found through
/// `lua_package_path` and a Python PDK plugin from its plugin server; validate, sync (the
/// schema's defaults filled in), a clean second diff, a dump that syncs back unchanged, and a
/// config its schema refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deck_manages_custom_and_external_plugins() {
    let up = Upstream::start("deck-custom");
    let servers = tempfile::tempdir().unwrap();
    let mut builder = Gateway::sqlite().env(
        "TURNPIKE_LUA_PACKAGE_PATH",
        &format!(
            "{}/tests/integration/lua-plugins/?.lua;;",
            env!("CARGO_MANIFEST_DIR")
        ),
    );
    for (k, v) in crate::external_plugins::py_greeter_env(servers.path()) {
        builder = builder.env(&k, &v);
    }
    let gw = builder
        .env("TURNPIKE_PLUGINS", "bundled,greeting,py-greeter")
        .start();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let yaml = format!(
        r#"_format_version: "3.0"
services:
- name: s
  url: {}
  routes:
  - name: r
    paths: [/g]
    plugins:
    - name: greeting
      config:
        greeting: hey
        times: 2
    - name: py-greeter
      config:
        message: deck
"#,
        up.url()
    );
    std::fs::write(dir.join("custom.yaml"), &yaml).unwrap();
    ok(&gw, dir, &["gateway", "validate", "custom.yaml"]);
    let out = ok(&gw, dir, &["gateway", "sync", "custom.yaml"]);
    assert_eq!(summary(&out), (4, 0, 0), "{out}");
    let out = ok(&gw, dir, &["gateway", "diff", "custom.yaml"]);
    assert_eq!(summary(&out), (0, 0, 0), "{out}");
    ok(&gw, dir, &["gateway", "dump", "-o", "dump.yml", "--yes"]);
    let dump = std::fs::read_to_string(dir.join("dump.yml")).unwrap();
    // The schemas' defaults are in the dump, as Kong's would be.
    assert!(dump.contains("header_name: X-Greeting"), "{dump}");
    assert!(dump.contains("deny_header: x-deny"), "{dump}");
    let out = ok(&gw, dir, &["gateway", "sync", "dump.yml"]);
    assert_eq!(summary(&out), (0, 0, 0), "{out}");
    // Both run on what decK synced.
    let mut seen = serde_json::Value::Null;
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            seen = get(gw.proxy, "x", "/g").await.json()["headers"].clone();
            seen["x-greeting"] == "hey,hey" && seen["x-py-greeting"] == "deck x"
        })
        .await,
        "{seen}"
    );
    // A config the plugin's schema refuses is refused, with the field named.
    std::fs::write(dir.join("bad.yaml"), yaml.replace("times: 2", "times: 9")).unwrap();
    let (success, out) = run_deck(&gw, dir, &["gateway", "sync", "bad.yaml"]);
    assert!(!success, "{out}");
    assert!(out.contains("times"), "{out}");
}
