//! The declarative loader: documents, entities, errors, references (`reload`: the streaming
//! reader, reloads against the running config, writing configs back).

use super::*;
use crate::entity::{EntitySpec, FieldKind, PluginEntity, CONSUMER};

mod reload;

/// The credential tables of key-auth, basic-auth and acl, as those plugins' folders declare
/// them: the loader is tested here without the plugins crate.
struct Credentials;

const fn table(
    table: &'static str,
    endpoint_key: Option<&'static str>,
    unique: &'static [&'static str],
    cache_key: &'static [&'static str],
    fields: &'static [(&'static str, FieldKind)],
) -> PluginEntity {
    PluginEntity {
        spec: EntitySpec {
            table,
            path: table,
            nested_path: table,
            endpoint_key,
            unique,
            cache_key,
            foreign: CONSUMER,
        },
        fields,
        sample: "{}",
        check: None,
    }
}

static KEYAUTH: PluginEntity = table(
    "keyauth_credentials",
    Some("key"),
    &["key"],
    &[],
    &[("key", FieldKind::Auto), ("ttl", FieldKind::Int)],
);
static BASICAUTH: PluginEntity = table(
    "basicauth_credentials",
    Some("username"),
    &["username"],
    &[],
    &[
        ("username", FieldKind::Required),
        ("password", FieldKind::Required),
    ],
);
static ACLS: PluginEntity = table(
    "acls",
    None,
    &[],
    &["consumer", "group"],
    &[("group", FieldKind::Required)],
);

impl PluginRegistry for Credentials {
    fn check(&self, _name: &str, _config: &Value) -> Option<Result<Value, Vec<(String, String)>>> {
        None
    }
    fn entities(&self) -> &'static [&'static PluginEntity] {
        static ALL: [&PluginEntity; 3] = [&KEYAUTH, &BASICAUTH, &ACLS];
        &ALL
    }
}

fn ok(yaml: &str) -> Config {
    load_str(yaml, &Credentials).unwrap_or_else(|e| panic!("unexpected errors:\n{e}"))
}

fn err(yaml: &str) -> DeclarativeError {
    load_str(yaml, &Credentials).expect_err("expected the config to be rejected")
}

#[test]
fn equal_lists_hosts_and_paths_are_held_once() {
    let c = ok(r#"
_format_version: "3.0"
services:
  - name: a
    url: http://upstream.example:8080/api/v1
    tags: [generated, team-1]
    routes:
      - name: ra
        paths: ["/a"]
        methods: [GET, POST]
        tags: [generated, team-1]
  - name: b
    url: http://upstream.example:8080/api/v1
    tags: [generated, team-1]
    routes:
      - name: rb
        paths: ["/b"]
        methods: [GET, POST]
  - name: c
    url: http://other.example/api/v1
    tags: [generated, team-2]
consumers:
  - username: x
    tags: [generated, team-1]
"#);
    let (a, b, s3) = (&c.services[0], &c.services[1], &c.services[2]);
    let shared = |x: &Option<Shared<String>>, y: &Option<Shared<String>>| {
        Shared::same(x.as_ref().unwrap(), y.as_ref().unwrap())
    };
    assert!(shared(&a.tags, &b.tags));
    assert!(shared(&a.tags, &c.routes[0].tags));
    assert!(shared(&a.tags, &c.consumers[0].tags));
    assert!(!shared(&a.tags, &s3.tags));
    assert_eq!(s3.tags.as_deref().unwrap(), ["generated", "team-2"]);
    assert!(std::sync::Arc::ptr_eq(&a.host, &b.host));
    assert!(std::sync::Arc::ptr_eq(
        a.path.as_ref().unwrap(),
        b.path.as_ref().unwrap()
    ));
    assert!(shared(&c.routes[0].methods, &c.routes[1].methods));
    // Written out as lists, as before.
    let out = serde_json::to_value(&c.routes[0]).unwrap();
    assert_eq!(out["methods"], serde_json::json!(["GET", "POST"]));
    assert_eq!(out["tags"], serde_json::json!(["generated", "team-1"]));
}

#[test]
fn nested_services_routes_with_defaults_and_kong_ids() {
    let c = ok(r#"
_format_version: "3.0"
_comment: hello
services:
  - name: example-service
    url: http://example.com:8080/api
    _comment: per-entity comments are allowed
    routes:
      - name: r1
        paths: ["/a"]
"#);
    let s = &c.services[0];
    assert_eq!(s.protocol, "http");
    assert_eq!(&*s.host, "example.com");
    assert_eq!(s.port, 8080);
    assert_eq!(s.path.as_deref(), Some("/api"));
    assert_eq!(s.retries, 5);
    assert_eq!(s.connect_timeout, 60000);
    assert_eq!(s.id, ids::entity_id("services", "example-service").into());
    let r = &c.routes[0];
    assert_eq!(r.service.as_ref().unwrap().id.as_ref(), &*s.id);
    assert_eq!(r.protocols.iter().collect::<Vec<_>>(), ["http", "https"]);
    assert!(r.strip_path && !r.preserve_host);
    assert_eq!(r.https_redirect_status_code, 426);
    assert_eq!(r.path_handling, PathHandling::V0);
    assert_eq!(r.id, ids::entity_id("routes", "r1"));
}

#[test]
fn https_url_defaults_to_443() {
    let c = ok("_format_version: '3.0'\nservices:\n- name: s\n  url: https://example.com\n  routes: [{paths: [/]}]\n");
    assert_eq!(c.services[0].port, 443);
    assert_eq!(c.services[0].protocol, "https");
    assert_eq!(c.services[0].path, None);
}

#[test]
fn json_is_accepted() {
    let c = load_str(
        r#"{"_format_version":"3.0","services":[{"name":"s","host":"h","routes":[{"hosts":["a.com"]}]}]}"#,
        &NoPlugins,
    )
    .unwrap();
    assert_eq!(c.routes.len(), 1);
    assert_eq!(c.services[0].port, 80);
}

#[test]
fn top_level_references_by_name_and_id() {
    let c = ok(r#"
_format_version: "3.0"
services:
  - name: s1
    host: a.internal
  - id: 0a9b8c1e-0000-4000-8000-000000000001
    host: b.internal
routes:
  - name: by-name
    service: s1
    paths: [/x]
  - name: by-id
    service: 0a9b8c1e-0000-4000-8000-000000000001
    paths: [/y]
  - name: by-object
    service: { id: 0a9b8c1e-0000-4000-8000-000000000001 }
    paths: [/z]
"#);
    assert_eq!(
        c.routes[0].service.as_ref().unwrap().id.as_ref(),
        c.services[0].id.as_ref()
    );
    assert_eq!(
        c.routes[1].service.as_ref().unwrap().id.as_ref(),
        "0a9b8c1e-0000-4000-8000-000000000001"
    );
    assert_eq!(
        c.routes[2].service.as_ref().unwrap().id.as_ref(),
        "0a9b8c1e-0000-4000-8000-000000000001"
    );
}

#[test]
fn errors_name_entity_and_field_path() {
    let e = err(r#"
_format_version: "3.0"
services:
  - name: ok
    host: fine.example
  - name: bad
    port: 99999
    routes:
      - name: r
        paths: ["no-slash"]
        methods: ["get"]
        bogus: 1
"#);
    let lines = e.lines().join("\n");
    assert!(
        lines.contains("in services.2 (service 'bad'): host: required field missing"),
        "{lines}"
    );
    assert!(
        lines.contains("port: value should be between 0 and 65535"),
        "{lines}"
    );
    assert!(
        lines.contains("in services.2.routes.1 (route 'r'): paths.1: should start with: / (fixed path) or ~/ (regex path)"),
        "{lines}"
    );
    assert!(lines.contains("methods.1: invalid value: get"), "{lines}");
    assert!(lines.contains("bogus: unknown field"), "{lines}");
    let fields = e.fields();
    assert_eq!(fields["services"][1]["host"], "required field missing");
    assert_eq!(fields["services"][1]["routes"][0]["bogus"], "unknown field");
    let flat = e.flattened();
    assert_eq!(flat.as_array().unwrap().len(), 2);
    assert_eq!(flat[0]["entity_type"], "service");
    assert_eq!(flat[0]["entity_name"], "bad");
    let body = e.to_kong_json(true);
    assert_eq!(body["code"], 14);
    assert_eq!(body["name"], "invalid declarative configuration");
}

/// A parent's nested lists are entities of their own, read in place: the parent's errors
/// neither call them unknown fields nor show them in its entity.
#[test]
fn errors_of_a_parent_leave_its_nested_entities_out() {
    let e = err(r#"
_format_version: "3.0"
services:
  - name: bad
    port: 99999
    plugins: [{name: key-auth}]
    routes:
      - name: r
        paths: ["/"]
        bogus: 1
consumers:
  - username: alice
    oops: 1
    keyauth_credentials: [{key: k}]
"#);
    let lines = e.lines().join("\n");
    assert!(!lines.contains("routes: unknown field"), "{lines}");
    assert!(
        !lines.contains("keyauth_credentials: unknown field"),
        "{lines}"
    );
    assert!(lines.contains("oops: unknown field"), "{lines}");
    assert!(
        lines.contains("in services.1.routes.1 (route 'r'): bogus: unknown field"),
        "{lines}"
    );
    let flat = e.flattened();
    let service = flat
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["entity_type"] == "service")
        .unwrap();
    assert_eq!(service["entity"]["port"], 99999, "{service}");
    assert!(service["entity"].get("routes").is_none(), "{service}");
    assert!(service["entity"].get("plugins").is_none(), "{service}");
    let consumer = flat
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["entity_type"] == "consumer")
        .unwrap();
    assert!(
        consumer["entity"].get("keyauth_credentials").is_none(),
        "{consumer}"
    );
    assert_eq!(e.fields()["consumers"][0]["oops"], "unknown field");
}

#[test]
fn format_version_rules() {
    assert!(err("services: []").lines()[0].contains("_format_version: required field missing"));
    assert!(err("_format_version: '4.0'").lines()[0].contains("expected one of: 1.1, 2.1, 3.0"));
    // 3.0 requires `~` on regex paths; 2.1 files get it added.
    assert!(load_str(
        "_format_version: '3.0'\nroutes: [{paths: ['/v\\d+/x']}]",
        &NoPlugins
    )
    .is_ok());
    let c = ok("_format_version: '2.1'\nroutes: [{paths: ['/v\\d+/x', '/plain']}]");
    assert_eq!(
        c.routes[0].paths.as_ref().unwrap(),
        &vec!["~/v\\d+/x".to_string(), "/plain".to_string()]
    );
}

#[test]
fn route_needs_a_matching_field() {
    let e = err("_format_version: '3.0'\nroutes: [{name: r, protocols: [http]}]");
    assert!(e.lines()[0].contains(
        "must set one of 'methods', 'hosts', 'headers', 'paths' when 'protocols' is 'http'"
    ));
    let e = err(
        "_format_version: '3.0'\nroutes: [{name: r, paths: [/], snis: [a.com], protocols: [http]}]",
    );
    assert!(
        e.to_string()
            .contains("'snis' can only be set when 'protocols'"),
        "{e}"
    );
    let e = err("_format_version: '3.0'\nroutes: [{name: r, headers: {Host: [a]}}]");
    assert!(
        e.to_string().contains("cannot contain 'host' header"),
        "{e}"
    );
    let e = err("_format_version: '3.0'\nroutes: [{name: r, hosts: ['a.*.com']}]");
    assert!(e.to_string().contains("invalid wildcard"), "{e}");
    let e = err("_format_version: '3.0'\nroutes: [{name: r, paths: ['~/(unclosed']}]");
    assert!(e.to_string().contains("invalid regex"), "{e}");
    let e = err(
        "_format_version: '3.0'\nroutes: [{name: r, paths: [/], https_redirect_status_code: 303}]",
    );
    assert!(
        e.to_string()
            .contains("expected one of: 426, 301, 302, 307, 308"),
        "{e}"
    );
}

#[test]
fn broken_references_and_duplicates() {
    let e = err("_format_version: '3.0'\nroutes: [{name: r, service: nope, paths: [/]}]");
    assert!(
        e.to_string()
            .contains("invalid reference 'service: nope' (no such entry in 'services')"),
        "{e}"
    );
    let e = err("_format_version: '3.0'\nservices: [{name: a, host: h}, {name: a, host: h}]");
    assert!(
        e.to_string()
            .contains("uniqueness violation: 'services' entity with primary key set to"),
        "{e}"
    );
    let e = err("_format_version: '3.0'\nconsumers: [{username: u, custom_id: c}, {username: v, custom_id: c}]");
    assert!(
        e.to_string()
            .contains("with custom_id set to 'c' already declared"),
        "{e}"
    );
}

#[test]
fn upstreams_targets_and_kong_target_ids() {
    let c = ok(r#"
_format_version: "3.0"
upstreams:
  - name: backend
    targets:
      - target: 10.0.0.1:8080
      - target: 10.0.0.2
        weight: 0
services:
  - name: s
    host: backend
    routes: [{paths: [/]}]
"#);
    let up = &c.upstreams[0];
    assert_eq!(up.slots, 10000);
    assert_eq!(up.algorithm, "round-robin");
    assert_eq!(c.targets[0].upstream.id.as_ref(), up.id.as_str());
    assert_eq!(c.targets[1].target, "10.0.0.2:8000");
    assert_eq!(c.targets[1].weight, 0);
    // Kong: uuid5("targets", "targets:*:<upstream id>:<target as written>").
    assert_eq!(
        c.targets[0].id,
        ids::entity_id("targets", &format!("targets:*:{}:10.0.0.1:8080", up.id))
    );
    let e = err("_format_version: '3.0'\nupstreams: [{name: 10.0.0.1}]");
    assert!(e.to_string().contains("no ip addresses allowed"), "{e}");
    let e = err(
        "_format_version: '3.0'\nupstreams: [{name: u, targets: [{target: a:1}, {target: a:1}]}]",
    );
    assert!(e.to_string().contains("uniqueness violation"), "{e}");
}

#[test]
fn plugins_are_checked_against_the_registry() {
    let e = err("_format_version: '3.0'\nplugins: [{name: key-auth}]");
    assert!(
        e.to_string().contains(
            "plugin 'key-auth' not enabled; add it to the 'plugins' configuration property"
        ),
        "{e}"
    );
    struct One;
    impl PluginRegistry for One {
        fn check(
            &self,
            name: &str,
            config: &Value,
        ) -> Option<Result<Value, Vec<(String, String)>>> {
            (name == "demo").then(|| {
                if config.get("bad").is_some() {
                    Err(vec![("bad".into(), "unknown field".into())])
                } else {
                    Ok(serde_json::json!({"x": 1}))
                }
            })
        }
    }
    let c = load_str(
        "_format_version: '3.0'\nservices: [{name: s, host: h, plugins: [{name: demo}]}]",
        &One,
    )
    .unwrap();
    assert_eq!(
        c.plugins[0].service.as_ref().unwrap().id.as_ref(),
        c.services[0].id.as_ref()
    );
    assert_eq!(c.plugins[0].config["x"], 1);
    assert_eq!(
        c.plugins[0].id,
        ids::entity_id("plugins", &format!("plugins:*:demo::{}:", c.services[0].id))
    );
    let e = load_str(
        "_format_version: '3.0'\nplugins: [{name: demo, config: {bad: 1}}]",
        &One,
    )
    .unwrap_err();
    assert!(e.to_string().contains("config.bad: unknown field"), "{e}");
}

#[test]
fn consumers_and_credentials() {
    let c = ok(r#"
_format_version: "3.0"
consumers:
  - username: alice
    keyauth_credentials:
      - key: secret-key
    basicauth_credentials:
      - username: alice
        password: pw
    acls:
      - group: admins
keyauth_credentials:
  - key: k2
    consumer: alice
"#);
    assert_eq!(&*c.consumers[0].id, ids::entity_id("consumers", "alice"));
    assert_eq!(c.credentials.len(), 4);
    assert!(c
        .credentials
        .iter()
        .all(|cr| *cr.consumer.id == *c.consumers[0].id));
    // Nested credentials point at their consumer's own id, no copy each (56 bytes a key).
    let mut nested = c.credentials.iter().filter(|cr| {
        cr.table != "keyauth_credentials" || cr.fields.get_str("key") == Some("secret-key")
    });
    assert_eq!(nested.clone().count(), 3);
    assert!(nested.all(|cr| std::sync::Arc::ptr_eq(&cr.consumer.id, &c.consumers[0].id)));
    let basic = c
        .credentials
        .iter()
        .find(|cr| cr.table == "basicauth_credentials")
        .unwrap();
    assert_eq!(
        basic.id,
        ids::entity_id("basicauth_credentials", "basicauth_credentials:*:alice")
    );
    let acl = c.credentials.iter().find(|cr| cr.table == "acls").unwrap();
    assert_eq!(
        acl.id,
        ids::entity_id("acls", &format!("acls:*:{}:admins", c.consumers[0].id))
    );
    let e = err("_format_version: '3.0'\nconsumers: [{tags: [a]}]");
    assert!(
        e.to_string()
            .contains("at least one of these fields must be non-empty"),
        "{e}"
    );
    let e = err("_format_version: '3.0'\nconsumers: [{username: a, keyauth_credentials: [{key: k}]}, {username: b, keyauth_credentials: [{key: k}]}]");
    assert!(
        e.to_string()
            .contains("with key set to 'k' already declared"),
        "{e}"
    );
}

#[test]
fn certificates_with_transient_snis() {
    let k = rcgen::KeyPair::generate().unwrap();
    let pem = rcgen::CertificateParams::new(vec!["a.example.com".into()])
        .unwrap()
        .self_signed(&k)
        .unwrap()
        .pem();
    // As JSON strings, which YAML reads too.
    let (pem, key) = (
        serde_json::to_string(&pem).unwrap(),
        serde_json::to_string(&k.serialize_pem()).unwrap(),
    );
    let c = ok(&format!(
        "_format_version: '3.0'\ncertificates:\n- cert: {pem}\n  key: {key}\n  snis: [a.example.com, '*.b.example.com']\n"
    ));
    assert_eq!(c.snis.len(), 2);
    assert_eq!(
        c.snis[0].certificate.id.as_ref(),
        c.certificates[0].id.as_str()
    );
    let e = err("_format_version: '3.0'\ncertificates: [{cert: nope}]");
    let s = e.to_string();
    assert!(
        s.contains("key: required field missing") && s.contains("invalid cert"),
        "{s}"
    );
    // PEM-shaped but not a certificate the TLS stack loads.
    let bad = "-----BEGIN CERTIFICATE-----\\nMIIB\\n-----END CERTIFICATE-----";
    let e = err(&format!(
        "_format_version: '3.0'\ncertificates:\n- cert: \"{bad}\"\n  key: {key}\n"
    ));
    assert!(e.to_string().contains("invalid certificate"), "{e}");
}

#[test]
fn service_entity_checks() {
    let e = err("_format_version: '3.0'\nservices: [{name: s, host: h, protocol: tcp, path: /x}]");
    assert!(e.to_string().contains("path: value must be null"), "{e}");
    let e = err("_format_version: '3.0'\nservices: [{name: s, host: h, tls_verify: true}]");
    assert!(
        e.to_string().contains("tls_verify: value must be null"),
        "{e}"
    );
    let e = err("_format_version: '3.0'\nservices: [{name: 'bad name', host: 'bad host'}]");
    let s = e.to_string();
    assert!(
        s.contains("the only accepted ascii characters") && s.contains("invalid hostname"),
        "{s}"
    );
    let e = err("_format_version: '3.0'\nservices: [{name: s, url: 'nonsense'}]");
    assert!(e.to_string().contains("url: missing scheme in url"), "{e}");
}

#[test]
fn malformed_documents_are_errors_not_panics() {
    for text in [
        "",
        "[]",
        "{",
        "_format_version: [",
        "\u{0}",
        "- a\n- b",
        "_format_version: '3.0'\nservices: {}",
    ] {
        assert!(load_str(text, &NoPlugins).is_err(), "{text:?} should fail");
    }
    let e = err("_format_version: '3.0'\nservices: [1, 'x']\nunknowns: []");
    let s = e.to_string();
    assert!(
        s.contains("services.1: expected a record") && s.contains("unknowns: unknown field"),
        "{s}"
    );
}

#[test]
fn hash_is_stable_for_the_same_input() {
    let a = ok("_format_version: '3.0'\nservices: [{name: s, host: h}]");
    let b =
        ok("{\"services\": [{\"host\": \"h\", \"name\": \"s\"}], \"_format_version\": \"3.0\"}");
    assert_eq!(a.hash, b.hash);
    let c = ok("_format_version: '3.0'\nservices: [{name: s, host: h2}]");
    assert_ne!(a.hash, c.hash);
}

#[test]
fn apply_change_matches_a_full_load() {
    let text = "_format_version: '3.0'\nservices:\n- name: a\n  host: h\n  routes:\n  - name: ra\n    paths: [/a]\n";
    let mut cfg = load_str(text, &NoPlugins).unwrap();
    let sid = cfg.services[0].id.clone();
    let rid = "0b5c8a3e-5d6f-4a8b-9c0d-1e2f3a4b5c6d";
    let route =
        serde_json::json!({"id": rid, "name": "rb", "paths": ["/b"], "service": {"id": sid}});
    cfg.apply_change("routes", rid, route.as_object(), &NoPlugins)
        .unwrap();
    assert_eq!(cfg.routes.len(), 2);
    assert_eq!(
        cfg.routes[1].service.as_ref().unwrap().id.as_ref(),
        sid.as_ref()
    );
    // Replace in place, then remove.
    let route =
        serde_json::json!({"id": rid, "name": "rb", "paths": ["/c"], "service": {"id": sid}});
    cfg.apply_change("routes", rid, route.as_object(), &NoPlugins)
        .unwrap();
    assert_eq!(cfg.routes.len(), 2);
    assert_eq!(cfg.routes[1].paths.as_ref().unwrap()[0], "/c");
    cfg.apply_change("routes", rid, None, &NoPlugins).unwrap();
    assert_eq!(cfg.routes.len(), 1);
    // A row that does not read is refused, and the config is unchanged.
    let bad = serde_json::json!({"id": rid, "paths": ["no-slash"]});
    assert!(cfg
        .apply_change("routes", rid, bad.as_object(), &NoPlugins)
        .is_err());
    assert_eq!(cfg.routes.len(), 1);
}

/// Many adds, updates and deletes through `apply_change` (found by position) against a plain
/// list of what the config must hold, in order (a delete keeps the others' order: it breaks
/// ties between routes); copies taken along the way keep what they held (the lists share
/// chunks).
#[test]
fn apply_change_keeps_the_lists_their_order_and_positions_right() {
    let text = "_format_version: '3.0'\nservices:\n- name: a\n  host: h\n";
    let mut cfg = load_str(text, &NoPlugins).unwrap();
    let sid = cfg.services[0].id.clone();
    // (id, path), in the config's order.
    let mut model: Vec<(String, String)> = Vec::new();
    let mut copies = Vec::new();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for step in 0..3000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let id = format!("00000000-0000-4000-8000-{:012}", x % 400);
        let at = model.iter().position(|(m, _)| *m == id);
        if (x >> 40).is_multiple_of(4) {
            cfg.apply_change("routes", &id, None, &NoPlugins).unwrap();
            if let Some(i) = at {
                model.remove(i);
            }
        } else {
            let path = format!("/p{step}");
            let route = serde_json::json!({"id": id, "paths": [path], "service": {"id": sid}});
            cfg.apply_change("routes", &id, route.as_object(), &NoPlugins)
                .unwrap();
            match at {
                Some(i) => model[i].1 = path,
                None => model.push((id.clone(), path)),
            }
        }
        if step % 500 == 0 {
            copies.push((cfg.clone(), model.clone()));
        }
    }
    let check = |cfg: &mut Config, model: &[(String, String)]| {
        let listed: Vec<(String, String)> = cfg
            .routes
            .iter()
            .map(|r| (r.id.clone(), r.paths.as_ref().unwrap()[0].clone()))
            .collect();
        assert_eq!(listed, model);
        for (id, path) in model {
            assert_eq!(&cfg.route(id).unwrap().paths.as_ref().unwrap()[0], path);
        }
        assert!(cfg.route("00000000-0000-4000-8000-999999999999").is_none());
    };
    check(&mut cfg, &model);
    for (mut c, held) in copies {
        check(&mut c, &held);
    }
}

/// Deep flow nesting is refused before the YAML parser, whose time grows with the square of
/// the depth; ordinary nesting, brackets in strings and comments are not counted against it.
#[test]
fn deep_yaml_nesting_is_refused_fast() {
    let deep = format!(
        "_format_version: '3.0'\nservices: {}{}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    // The scanner's message: the parser never saw it.
    let e = super::parse_text(&deep).unwrap_err();
    assert!(e.to_string().contains("nested deeper than"), "{e}");
    let fine = format!(
        "_format_version: '3.0'\n# {}\nservices: [{{name: a, host: h, tags: ['{}', \"{}\"]}}]\n",
        "[".repeat(600),
        "[".repeat(600),
        "{".repeat(600)
    );
    assert!(super::parse_text(&fine).is_ok());
    // JSON: serde_json's own recursion limit answers at once.
    let deep_json = format!("{{\"a\": {}{}}}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(super::parse_text(&deep_json).is_err());
}

#[test]
fn same_id_compares_whole_ids() {
    use super::same_id;
    let a = "6b1d8a0e-3c9f-4b7a-9e2d-5f4c3b2a1d00";
    assert!(same_id(a, &String::from(a)));
    assert!(!same_id(a, "6b1d8a0e-3c9f-4b7a-9e2d-5f4c3b2a1d01"));
    assert!(!same_id(a, "7b1d8a0e-3c9f-4b7a-9e2d-5f4c3b2a1d00"));
    assert!(!same_id(a, "6b1d8a0e"));
    assert!(same_id("r1", "r1") && !same_id("r1", "r2"));
}

#[test]
fn route_protocols_keep_their_order_and_foreign_keys_share_one_id() {
    let c = ok(r#"
_format_version: "3.0"
services:
  - name: s
    url: http://example.com
    routes:
      - {name: a, paths: ["/a"], protocols: [https, http]}
      - {name: b, paths: ["/b"]}
routes:
  - {name: c, paths: ["/c"], service: s, protocols: [grpcs]}
"#);
    let json = serde_json::to_value(&*c.routes[0]).unwrap();
    assert_eq!(json["protocols"], serde_json::json!(["https", "http"]));
    assert_eq!(
        serde_json::to_value(&*c.routes[1]).unwrap()["protocols"],
        serde_json::json!(["http", "https"])
    );
    let c_route = c
        .routes
        .iter()
        .find(|r| r.name.as_deref() == Some("c"))
        .unwrap();
    assert!(c_route.protocols.contains("grpcs") && !c_route.protocols.contains("http"));
    // Nested and top-level routes of one service hold the same allocation of its id.
    let fks: Vec<_> = c
        .routes
        .iter()
        .map(|r| r.service.clone().unwrap().id)
        .collect();
    assert_eq!(&*fks[0], &*c.services[0].id);
    assert!(fks.iter().all(|id| std::sync::Arc::ptr_eq(id, &fks[0])));
}

/// Kong's route subschemas by first protocol (`routes_subschemas.lua`), messages verbatim.
#[test]
fn grpc_and_stream_route_subschemas() {
    let cases = [
        (
            "{name: r, protocols: [grpc], paths: [/a.B/C], strip_path: true}",
            "strip_path: cannot set 'strip_path' when 'protocols' is 'grpc' or 'grpcs'",
        ),
        (
            "{name: r, protocols: [grpc], paths: [/a.B/C], methods: [POST]}",
            "methods: cannot set 'methods' when 'protocols' is 'grpc' or 'grpcs'",
        ),
        (
            "{name: r, protocols: [grpcs], hosts: [a], sources: [{ip: 10.0.0.1}]}",
            "sources: cannot set 'sources' when 'protocols' is 'grpc' or 'grpcs'",
        ),
        (
            "{name: r, protocols: [grpc]}",
            "must set one of 'hosts', 'headers', 'paths' when 'protocols' is 'grpc'",
        ),
        (
            "{name: r, protocols: [grpc, grpcs]}",
            "must set one of 'hosts', 'headers', 'paths', 'snis' when 'protocols' is 'grpcs'",
        ),
        (
            "{name: r, protocols: [grpc], snis: [a.test], paths: [/x]}",
            "'snis' can only be set when 'protocols' is 'grpcs', 'https', 'tls' or 'tls_passthrough'",
        ),
        (
            "{name: r, protocols: [grpc, http], paths: [/x]}",
            "mixing protocol types is not allowed",
        ),
        (
            "{name: r, paths: [/x], destinations: [{port: 80}]}",
            "destinations: cannot set 'destinations' when 'protocols' is 'http' or 'https'",
        ),
        (
            "{name: r, protocols: [tcp], paths: [/x], sources: [{ip: 10.0.0.1}]}",
            "paths: cannot set 'paths' when 'protocols' is 'tcp', 'tls', 'tls_passthrough' or 'udp'",
        ),
        (
            "{name: r, protocols: [tcp]}",
            "must set one of 'sources', 'destinations', 'snis' when 'protocols' is 'tcp', 'tls' or 'udp'",
        ),
        (
            "{name: r, protocols: [tls_passthrough]}",
            "must set snis when 'protocols' is 'tls_passthrough'",
        ),
        (
            "{name: r, protocols: [tcp], destinations: [{ip: 10.0.0.300}]}",
            "invalid ip or cidr range: '10.0.0.300'",
        ),
        (
            "{name: r, protocols: [tcp], sources: [{port: 70000}]}",
            "value should be between 0 and 65535",
        ),
        (
            "{name: r, protocols: [tcp], sources: [{}]}",
            "at least one of these fields must be non-empty: 'ip', 'port'",
        ),
    ];
    for (route, expect) in cases {
        let e = err(&format!("_format_version: '3.0'\nroutes: [{route}]"));
        assert!(e.to_string().contains(expect), "{route}: {e}");
    }
    // A gRPC route's strip_path defaults to false; grpcs takes snis alone.
    let c = ok("_format_version: '3.0'\nroutes: [{name: r, protocols: [grpc, grpcs], paths: [/a.B/C]}, {name: s, protocols: [grpcs], snis: [a.test]}]");
    assert!(!c.routes[0].strip_path);
    // A gRPC service has no path and no per-service TLS settings (Kong 3.9: https and tls only).
    let e = err("_format_version: '3.0'\nservices: [{name: s, url: 'grpc://h:50051/x'}]");
    assert!(e.to_string().contains("path: value must be null"), "{e}");
    let e = err(
        "_format_version: '3.0'\nservices: [{name: s, url: 'grpcs://h:50051', tls_verify: true}]",
    );
    assert!(
        e.to_string().contains("tls_verify: value must be null"),
        "{e}"
    );
    let c = ok("_format_version: '3.0'\nservices: [{name: s, url: 'grpcs://h:50051'}]");
    assert_eq!(c.services[0].protocol, "grpcs");
}

#[test]
fn yaml_given_up_as_json_loads_and_fails_alike() {
    let yaml = "_format_version: \"3.0\"\nservices:\n- name: s\n  url: http://a.example/x\n  tags: [t]\n  routes:\n  - name: r\n    paths: [/r]\n";
    let json = into_json_text(yaml.to_string());
    assert!(json.starts_with('{'), "{json}");
    let (a, b) = (
        load_str(yaml, &NoPlugins).unwrap(),
        load_str(&json, &NoPlugins).unwrap(),
    );
    assert_eq!(a.hash, b.hash);
    assert_eq!(a.services[0].id, b.services[0].id);
    assert_eq!(a.routes[0].id, b.routes[0].id);
    // A document with errors: the same errors, in Kong's shape.
    let bad = "_format_version: \"3.0\"\nservices:\n- name: s\n  url: ftp://a.example\n  routes:\n  - name: r\n    paths: [r]\n";
    let (ea, eb) = (
        load_str(bad, &NoPlugins).unwrap_err(),
        load_str(&into_json_text(bad.to_string()), &NoPlugins).unwrap_err(),
    );
    assert_eq!(ea.to_string(), eb.to_string());
    // Text that is not YAML stays as it is, for its error.
    let broken = "services: [\n";
    assert_eq!(into_json_text(broken.to_string()), broken);
    // JSON is left alone.
    assert_eq!(into_json_text("{\"a\": 1}".into()), "{\"a\": 1}");
}
