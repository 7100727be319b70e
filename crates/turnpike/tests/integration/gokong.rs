//! Kong's Go client library (`github.com/kong/go-kong`, what decK and Kong's Kubernetes
//! controller are built on) decodes every entity Turnpike returns: `gokong/main.go`, built
//! with the Go toolchain and the module proxy (cached between runs), lists every kind and reads
//! each entity back by its id. Numbers are written as Kong writes them (`1`, not `1.0`) in the
//! Admin API, `/config` and `config db_export`, however they were sent.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::common::*;
use serde_json::{json, Value};

fn decoder() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| go_build("gokong", "gokong-decode"))
}

/// Every floating-point number in `v` with an integral value, by path.
fn integral_floats(v: &Value, at: &str, out: &mut Vec<String>) {
    match v {
        Value::Number(n) if n.is_f64() && n.as_f64().unwrap().fract() == 0.0 => {
            out.push(format!("{at} = {n}"))
        }
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, x)| integral_floats(x, &format!("{at}/{i}"), out)),
        Value::Object(m) => m
            .iter()
            .for_each(|(k, x)| integral_floats(x, &format!("{at}/{k}"), out)),
        _ => {}
    }
}

fn text(r: &Reply) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

async fn created(gw: &Gateway, path: &str, body: Value) -> Value {
    let r = gw.admin("POST", path, Some(body)).await;
    assert_eq!(r.status, 201, "POST {path}: {:?}", r.body);
    r.json()
}

#[tokio::test]
async fn kongs_go_client_decodes_every_entity_and_numbers_are_kongs() {
    let gw = Gateway::sqlite().start();
    // Numbers sent as floats (`1.0`), as a client in a dynamic language may send them.
    let up = created(
        &gw,
        "/upstreams",
        json!({"name": "up", "healthchecks": {"active": {"timeout": 1.0,
            "healthy": {"interval": 5.0}, "unhealthy": {"interval": 2.0}}, "threshold": 25.0}}),
    )
    .await;
    assert_eq!(up["healthchecks"]["active"]["timeout"], json!(1));
    assert!(up["healthchecks"]["active"]["timeout"].is_i64());
    assert!(up["healthchecks"]["active"]["unhealthy"]["interval"].is_i64());
    // A fraction stays a fraction (go-kong decodes these intervals into Go ints, as it does
    // Kong's, so this upstream is removed before go-kong reads the list).
    let frac = created(
        &gw,
        "/upstreams",
        json!({"name": "frac", "healthchecks": {"active": {"unhealthy": {"interval": 2.5}}}}),
    )
    .await;
    assert_eq!(
        frac["healthchecks"]["active"]["unhealthy"]["interval"],
        json!(2.5)
    );
    assert_eq!(
        gw.admin("DELETE", "/upstreams/frac", None).await.status,
        204
    );
    // And as a form, and left to their defaults.
    let r = admin_raw(
        gw.admin,
        "POST",
        "/upstreams",
        "application/x-www-form-urlencoded",
        "name=up2&healthchecks.active.timeout=3&healthchecks.threshold=10".into(),
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    created(&gw, "/upstreams", json!({"name": "up3"})).await;
    created(
        &gw,
        "/upstreams/up/targets",
        json!({"target": "127.0.0.1:9", "weight": 100.0}),
    )
    .await;
    created(
        &gw,
        "/upstreams/up2/targets",
        json!({"target": "127.0.0.1:10"}),
    )
    .await;
    created(
        &gw,
        "/services",
        json!({"name": "s", "url": "http://up", "connect_timeout": 5000.0}),
    )
    .await;
    created(
        &gw,
        "/services/s/routes",
        json!({"name": "r", "paths": ["/r"]}),
    )
    .await;
    created(&gw, "/consumers", json!({"username": "alice"})).await;
    created(&gw, "/consumers/alice/key-auth", json!({"key": "k"})).await;
    created(
        &gw,
        "/consumers/alice/basic-auth",
        json!({"username": "a", "password": "p"}),
    )
    .await;
    created(
        &gw,
        "/consumers/alice/hmac-auth",
        json!({"username": "h", "secret": "s"}),
    )
    .await;
    created(
        &gw,
        "/consumers/alice/jwt",
        json!({"key": "iss", "secret": "s"}),
    )
    .await;
    created(&gw, "/consumers/alice/acls", json!({"group": "g"})).await;
    created(
        &gw,
        "/consumers/alice/oauth2",
        json!({"name": "app", "redirect_uris": ["https://example.test/cb"]}),
    )
    .await;
    let (cert, key) = cert_for("gokong.test");
    created(
        &gw,
        "/certificates",
        json!({"cert": cert, "key": key, "snis": ["gokong.test"]}),
    )
    .await;
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "gokong CA");
    let ca = ca.self_signed(&ca_key).unwrap();
    created(&gw, "/ca_certificates", json!({"cert": ca.pem()})).await;
    created(
        &gw,
        "/vaults",
        json!({"prefix": "my-env", "name": "env", "config": {"prefix": "X_"}}),
    )
    .await;
    created(&gw, "/key-sets", json!({"name": "ks"})).await;
    let jwk = json!({"kid": "k1", "kty": "oct", "k": "c2VjcmV0"}).to_string();
    created(
        &gw,
        "/key-sets/ks/keys",
        json!({"name": "k1", "kid": "k1", "jwk": jwk}),
    )
    .await;
    // Plugins with number fields: sent as floats, and defaults that are numbers.
    created(
        &gw,
        "/plugins",
        json!({"name": "rate-limiting", "config": {"second": 5.0, "hour": 10000.0}}),
    )
    .await;
    created(
        &gw,
        "/services/s/plugins",
        json!({"name": "http-log", "config": {"http_endpoint": "http://127.0.0.1:9/log",
            "queue": {"initial_retry_delay": 1.0}}}),
    )
    .await;
    created(
        &gw,
        "/routes/r/plugins",
        json!({"name": "response-ratelimiting", "config": {"limits": {"video": {"minute": 10.0}}}}),
    )
    .await;
    created(&gw, "/routes/r/plugins", json!({"name": "zipkin"})).await;
    created(&gw, "/routes/r/plugins", json!({"name": "key-auth"})).await;

    // What any client reads: no integral number written with a fraction, anywhere.
    let mut found = Vec::new();
    for p in [
        "/",
        "/upstreams",
        "/upstreams/up",
        "/upstreams/up/targets",
        "/services",
        "/routes",
        "/plugins",
        "/consumers",
        "/certificates",
        "/schemas/upstreams",
        "/schemas/plugins/rate-limiting",
        "/schemas/plugins/zipkin",
        "/schemas/plugins/http-log",
    ] {
        let r = gw.admin("GET", p, None).await;
        assert_eq!(r.status, 200, "{p}");
        integral_floats(&r.json(), p, &mut found);
    }
    assert!(found.is_empty(), "written with a fraction: {found:#?}");
    let plugins = gw.admin("GET", "/plugins", None).await.json();
    let rl = plugins["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "rate-limiting")
        .unwrap()
        .clone();
    assert_eq!(rl["config"]["second"], json!(5), "{rl}");
    let schema = text(&gw.admin("GET", "/schemas/upstreams", None).await);
    assert!(
        !schema.contains(".0,") && !schema.contains(".0]"),
        "{schema}"
    );

    // Kong's Go client decodes all of it.
    let counts = go_kong_decodes(&gw);
    assert_eq!(
        counts,
        json!({"services": 1, "routes": 1, "consumers": 1, "upstreams": 3, "targets": 2,
            "certificates": 1, "snis": 1, "ca_certificates": 1, "plugins": 5, "vaults": 1,
            "key_sets": 1, "keys": 1, "keyauth_credentials": 1, "basicauth_credentials": 1,
            "hmacauth_credentials": 1, "jwt_secrets": 1, "acls": 1, "oauth2_credentials": 1})
    );

    // The export writes them as Kong does too (YAML: `timeout: 1`).
    let file = gw.dir.path().join("export.yml");
    let prefix = gw.dir.path().join("prefix");
    let (ok, text) = run(
        &["config", "db_export", file.to_str().unwrap()],
        &[
            ("TURNPIKE_DATABASE", "sqlite"),
            ("TURNPIKE_PREFIX", prefix.to_str().unwrap()),
        ],
    );
    assert!(ok, "{text}");
    let yaml = std::fs::read_to_string(&file).unwrap();
    assert!(yaml.contains("timeout: 1\n"), "{yaml}");
    let exported: Value = serde_yaml::from_str(&yaml).unwrap();
    let mut found = Vec::new();
    integral_floats(&exported, "export", &mut found);
    assert!(found.is_empty(), "exported with a fraction: {found:#?}");
}

#[tokio::test]
async fn dbless_config_and_its_echo_write_kongs_numbers() {
    let gw = Gateway::with_config(
        "_format_version: \"3.0\"\nupstreams:\n  - name: up\n    healthchecks:\n      threshold: 50.0\n",
    )
    .start();
    let r = gw.admin("GET", "/upstreams/up", None).await;
    assert!(text(&r).contains("\"timeout\":1,"), "{:?}", r.body);
    assert!(text(&r).contains("\"threshold\":50}"), "{:?}", r.body);
    let config = gw.admin("GET", "/config", None).await.json();
    let yaml = config["config"].as_str().unwrap();
    assert!(
        yaml.contains("timeout: 1\n") && yaml.contains("threshold: 50\n"),
        "{yaml}"
    );
    let posted = admin_raw(
        gw.admin,
        "POST",
        "/config",
        "application/json",
        json!({"_format_version": "3.0", "upstreams": [{"name": "up",
            "healthchecks": {"active": {"timeout": 2.0}}}]})
        .to_string()
        .into_bytes(),
    )
    .await;
    assert_eq!(posted.status, 201, "{:?}", posted.body);
    let mut found = Vec::new();
    integral_floats(&posted.json(), "echo", &mut found);
    assert!(found.is_empty(), "echoed with a fraction: {found:#?}");
    assert!(
        text(&posted).contains("\"timeout\":2,"),
        "{:?}",
        posted.body
    );
    go_kong_decodes(&gw);
}

/// What go-kong decoded of each kind (it exits non-zero at the first body it cannot decode).
fn go_kong_decodes(gw: &Gateway) -> Value {
    let out = Command::new(decoder())
        .arg(format!("http://{}", gw.admin))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "go-kong could not decode: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// On the expressions router, Kong's Go client (as Kong's Kubernetes controller drives it)
/// creates and updates routes with `expression` and `priority` (the largest priority Kong
/// allows, 2^46 - 1, included), reads them back by id, by name and in the list with both
/// fields as written, and gets Kong's schema violation for an expression that does not parse.
#[tokio::test]
async fn kongs_go_client_writes_and_reads_expression_routes() {
    let gw = Gateway::sqlite()
        .env("TURNPIKE_ROUTER_FLAVOR", "expressions")
        .start();
    let out = Command::new(decoder())
        .arg(format!("http://{}", gw.admin))
        .arg("expression-routes")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "go-kong failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5, "{lines:#?}");
    let users = json!({"name": "users", "priority": (1u64 << 46) - 1,
        "expression": "http.path ^= \"/users\" && http.method == \"GET\""});
    let plain = json!({"name": "plain", "priority": 7,
        "expression": "http.host == \"b.test\" || http.host == \"c.test\""});
    let pick = |v: &Value| json!({"name": v["name"], "priority": v["priority"], "expression": v["expression"]});
    assert_eq!(pick(&lines[0]), users);
    assert_eq!(pick(&lines[1]), plain);
    assert_eq!(lines[0]["strip_path"], true);
    assert_eq!(lines[0]["protocols"], json!(["http", "https"]));
    assert_eq!(lines[0]["paths"], Value::Null);
    let mut listed = vec![pick(&lines[2]), pick(&lines[3])];
    listed.sort_by_key(|v| v["name"].as_str().unwrap().to_string());
    assert_eq!(listed, vec![plain.clone(), users.clone()]);
    let refused = lines[4]["refused"].as_str().unwrap();
    assert!(
        refused.contains("HTTP status 400") && refused.contains("schema violation"),
        "{refused}"
    );
    // What go-kong wrote is what the router serves: the stored route is Kong's shape.
    let r = gw.admin("GET", "/routes/users", None).await.json();
    assert_eq!(r["priority"], json!((1u64 << 46) - 1));
    assert!(r["priority"].is_u64(), "{r}");
}
