use super::*;
use crate::entity::{EntitySpec, FieldKind, PluginEntity, CONSUMER};

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
    assert_eq!(s.host, "example.com");
    assert_eq!(s.port, 8080);
    assert_eq!(s.path.as_deref(), Some("/api"));
    assert_eq!(s.retries, 5);
    assert_eq!(s.connect_timeout, 60000);
    assert_eq!(s.id, ids::entity_id("services", "example-service"));
    let r = &c.routes[0];
    assert_eq!(r.service.as_ref().unwrap().id.as_ref(), s.id.as_str());
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
        c.services[0].id.as_str()
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
        c.services[0].id.as_str()
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
        sid.as_str()
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
    assert_eq!(&*fks[0], c.services[0].id);
    assert!(fks.iter().all(|id| std::sync::Arc::ptr_eq(id, &fks[0])));
}

/// Timestamps aside (each reader takes the clock), a JSON document read entity by entity
/// gives the config the whole-document reader gives, hash included.
#[test]
fn streaming_reader_equals_the_document_reader() {
    fn strip_times(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("created_at");
                m.remove("updated_at");
                // A key-auth key's id is random (its key is generated when absent).
                if m.contains_key("key") {
                    m.remove("id");
                }
                m.values_mut().for_each(strip_times);
            }
            Value::Array(a) => a.iter_mut().for_each(strip_times),
            _ => {}
        }
    }
    let docs = [
        serde_json::json!({
            "_format_version": "3.0",
            "_transform": false,
            "_comment": "all kinds",
            "services": [
                {"name": "a", "url": "http://a.example:8080/p", "tags": ["t"],
                 "routes": [{"name": "ra", "paths": ["/a", "~/re$"], "methods": ["GET"],
                             "plugins": [{"name": "key-auth"}]}],
                 "plugins": [{"name": "rate-limiting", "config": {"minute": 5}}]},
                {"name": "b", "host": "b.example", "enabled": false}
            ],
            "routes": [{"name": "rb", "hosts": ["x.example"], "service": "b"},
                       {"id": "0A9B8C1E-0000-4000-8000-000000000001", "paths": ["/id"],
                        "service": {"name": "a"}}],
            "upstreams": [{"name": "up", "targets": [{"target": "10.0.0.1:80", "weight": 5}]}],
            "targets": [{"target": "10.0.0.2:80", "upstream": "up"}],
            "consumers": [
                {"username": "alice", "custom_id": "c-1",
                 "keyauth_credentials": [{"key": "k1"}, {"key": "k2", "tags": ["x"]}],
                 "basicauth_credentials": [{"username": "alice", "password": "pw"}],
                 "acls": [{"group": "admins"}],
                 "plugins": [{"name": "cors"}]},
                {"username": "bob"}
            ],
            "keyauth_credentials": [{"key": "k3", "consumer": "bob"}],
            "plugins": [{"name": "prometheus"}, {"name": "acl", "route": "ra",
                         "config": {"allow": ["admins"]}}]
        }),
        serde_json::json!({"_format_version": "3.0"}),
        serde_json::json!({"_format_version": "3.0", "services": []}),
        // Children before their parent's own fields (decK writes keys in alphabetical order).
        serde_json::json!({"_format_version": "3.0",
            "consumers": [{"acls": [{"group": "g"}],
                           "basicauth_credentials": [{"password": "p", "username": "x"}],
                           "keyauth_credentials": [{"key": "k"}], "username": "zed"}],
            "services": [{"host": "h", "routes": [{"name": "r1", "paths": ["/1"]},
                                                  {"name": "r2", "paths": ["/2"], "plugins": [{"name": "cors"}]}],
                          "name": "svc"}],
            "upstreams": [{"targets": [{"target": "10.0.0.9:80"}], "name": "u2"}]}),
    ];
    /// Every plugin enabled, its config as given.
    struct Any;
    impl PluginRegistry for Any {
        fn check(&self, _: &str, config: &Value) -> Option<Result<Value, Vec<(String, String)>>> {
            Some(Ok(config.clone()))
        }
        fn entities(&self) -> &'static [&'static PluginEntity] {
            Credentials.entities()
        }
        fn allows_consumer(&self, _name: &str) -> bool {
            true
        }
    }
    for doc in docs {
        let text = doc.to_string();
        let whole = load(&doc, &Any).unwrap_or_else(|e| panic!("{e}"));
        let streamed = load_json_streaming(&text, &Any).expect("read by the stream");
        let (mut a, mut b) = (streamed.to_json(), whole.to_json());
        strip_times(&mut a);
        strip_times(&mut b);
        assert_eq!(a, b);
        assert_eq!(streamed.hash, whole.hash);
        assert_eq!(streamed.transform, whole.transform);
        assert_eq!(streamed.credentials.len(), whole.credentials.len());
        // The same document as YAML: made JSON text, then read entity by entity.
        let yaml = serde_yaml::to_string(&doc).unwrap();
        let json = yaml::to_json_text(&yaml).unwrap();
        let consumed = load_json_streaming(&json, &Any).expect("read by the stream");
        assert_eq!(load_str(&yaml, &Any).unwrap().hash, whole.hash);
        let mut c = consumed.to_json();
        strip_times(&mut c);
        assert_eq!(c, b);
        assert_eq!(consumed.hash, whole.hash);
    }
}

/// Documents with errors, and those that need the whole document, are left to the document
/// reader: `load_str` reports the same errors whatever the format.
#[test]
fn streaming_reader_leaves_errors_and_old_formats_to_the_document_reader() {
    let left = [
        r#"{"_format_version": "3.0", "services": [{"name": "a", "port": 99999}]}"#,
        r#"{"_format_version": "3.0", "routes": [{"paths": ["/"], "service": "nope"}]}"#,
        r#"{"_format_version": "3.0", "consumers": [{"username": "a"}, {"username": "a"}]}"#,
        r#"{"_format_version": "3.0", "consumers": [{"username": "a", "keyauth_credentials": [{"key": "k"}]}, {"username": "b", "keyauth_credentials": [{"key": "k"}]}]}"#,
        r#"{"_format_version": "3.0", "bogus": []}"#,
        r#"{"_format_version": "3.0", "services": {}}"#,
        r#"{"_format_version": "3.0", "services": [1]}"#,
        r#"{"services": [{"name": "a", "host": "h"}], "_format_version": "3.0"}"#,
        r#"{"_format_version": "1.1", "services": [{"name": "a", "host": "h", "routes": [{"paths": ["/x$"]}]}]}"#,
        r#"{"_format_version": "3.0", "services": [], "services": []}"#,
        r#"{"_format_version": "3.0"} trailing"#,
        r#"{"_format_version": "3.0", "_transform": "yes"}"#,
        r#"{"_format_version": "3.0", "services": [{"name": "s", "host": "h", "routes": [{"paths": ["/"], "service": "s"}]}]}"#,
        r#"{"_format_version": "3.0", "services": [{"name": "s", "host": "h", "routes": [{"paths": ["/"]}, "x"]}]}"#,
        r#"{"_format_version": "3.0", "services": [{"name": "s", "host": "h", "routes": [{"name": "r", "paths": ["/"]}]}, {"name": "t", "host": "h", "routes": [{"name": "r", "paths": ["/t"]}]}]}"#,
    ];
    for text in left {
        assert!(load_json_streaming(text, &Credentials).is_none(), "{text}");
        let v: Result<Value, _> = serde_json::from_str(text);
        let direct = match v {
            Ok(v) => load(&v, &Credentials)
                .map(|c| c.hash)
                .map_err(|e| e.to_string()),
            Err(_) => Err("unparsable".into()),
        };
        let via = load_str(text, &Credentials)
            .map(|c| c.hash)
            .map_err(|e| e.to_string());
        match (direct, via) {
            (Err(_), Err(_)) | (Ok(_), Ok(_)) => {}
            (a, b) => panic!("{text}: {a:?} vs {b:?}"),
        }
    }
    // Moved `_format_version` and old formats still load, through the document reader.
    assert!(load_str(left[7], &Credentials).is_ok());
    let old = load_str(left[8], &Credentials).unwrap();
    assert_eq!(old.routes[0].paths.as_ref().unwrap()[0], "~/x$");
    let e = load_str(left[0], &Credentials).unwrap_err().to_string();
    assert!(
        e.contains("port: value should be between 0 and 65535"),
        "{e}"
    );
}

/// A credential keeps only its set fields, and is still written with every field of its
/// entity, null when not set, as Kong writes it.
#[test]
fn credentials_keep_set_fields_and_write_every_field() {
    let c = ok(r#"
_format_version: "3.0"
consumers:
  - username: alice
    keyauth_credentials:
      - key: k1
      - key: k2
        ttl: 60
        tags: [a]
"#);
    let j = |i: usize| serde_json::to_value(&c.credentials[i]).unwrap();
    let first = j(0);
    assert_eq!(first["key"], "k1");
    assert!(first.get("ttl").is_some_and(Value::is_null), "{first}");
    assert!(first.get("tags").is_some_and(Value::is_null), "{first}");
    assert_eq!(first["consumer"]["id"], *c.consumers[0].id);
    assert_eq!(c.credentials[0].fields.get("ttl"), None);
    let names: Vec<&str> = c.credentials[0].fields.iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["key", "ttl", "tags"]);
    let second = j(1);
    assert_eq!(second["ttl"], 60);
    assert_eq!(second["tags"], serde_json::json!(["a"]));
}

/// A reload compared with the running config: unchanged routes are the running config's
/// own, changed, added and removed ones are named, and anything else changed is noticed.
#[test]
fn a_new_config_is_compared_with_the_running_one() {
    let doc = |path: &str, extra_route: bool, consumer: &str| {
        let mut routes = vec![
            serde_json::json!({"name": "a", "paths": ["/a"]}),
            serde_json::json!({"name": "b", "paths": [path]}),
        ];
        if extra_route {
            routes.push(serde_json::json!({"name": "c", "paths": ["/c"]}));
        }
        serde_json::json!({"_format_version": "3.0",
            "services": [{"name": "s", "host": "h", "routes": routes}],
            "consumers": [{"username": consumer}]})
        .to_string()
    };
    let mut old = ok(&doc("/b", true, "u"));
    old.routes = old
        .routes
        .iter()
        .map(|r| {
            let mut r = (**r).clone();
            r.created_at -= 100;
            std::sync::Arc::new(r)
        })
        .collect();
    // The same document again: nothing changes, every route is shared.
    let mut same = ok(&doc("/b", true, "u"));
    let c = same.changes_from(&old).expect("a patch");
    assert!(c.routes.is_empty() && !c.others, "{c:?}");
    assert_eq!(c.from, old.hash);
    for (n, o) in same.routes.iter().zip(&old.routes) {
        assert!(std::sync::Arc::ptr_eq(n, o));
    }
    // One route changed, one removed, a consumer renamed.
    let mut new = ok(&doc("/b2", false, "v"));
    let c = new.changes_from(&old).expect("a patch");
    let (b, cid) = (&old.routes[1].id, &old.routes[2].id);
    assert_eq!(c.routes, vec![b.clone(), cid.clone()]);
    assert!(c.others);
    assert!(std::sync::Arc::ptr_eq(&new.routes[0], &old.routes[0]));
    assert_eq!(new.routes[0].created_at, old.routes[0].created_at);
    assert_ne!(new.routes[1].created_at, old.routes[1].created_at);
    // Kept routes in another order: compiled whole.
    let mut swapped = ok(&serde_json::json!({"_format_version": "3.0",
        "services": [{"name": "s", "host": "h", "routes": [
            {"name": "b", "paths": ["/b"]}, {"name": "a", "paths": ["/a"]}]}]})
    .to_string());
    assert!(swapped.changes_from(&old).is_none());
}

/// The config written straight to text is the config as values, keys in Kong's order.
#[test]
fn config_is_written_as_kong_exports_it() {
    let c = ok(r#"
_format_version: "3.0"
services: [{name: s, host: h, routes: [{name: r, paths: [/]}]}]
consumers:
  - username: alice
    keyauth_credentials: [{key: k}]
    acls: [{group: g}]
"#);
    let text = serde_json::to_string(&c.json()).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v, c.to_json());
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        [
            "_format_version",
            "_transform",
            "services",
            "routes",
            "consumers",
            "keyauth_credentials",
            "acls"
        ]
    );
    assert_eq!(v["keyauth_credentials"][0]["key"], "k");
    assert!(!text.contains("upstreams"));
}

/// A reload read against the running config shares the routes it leaves alone as it reads
/// them, and never a route whose fields or service changed.
#[test]
fn a_reload_shares_unchanged_routes_as_it_reads_them() {
    let doc = |b_path: &str, c_service: &str| {
        serde_json::json!({"_format_version": "3.0",
            "services": [
                {"name": "s", "host": "h", "routes": [
                    {"name": "a", "paths": ["/a"]}, {"name": "b", "paths": [b_path]}]},
                {"name": "t", "host": "h2"}],
            "routes": [{"name": "c", "paths": ["/c"], "service": c_service}]})
        .to_string()
    };
    let mut old = load_json_streaming(&doc("/b", "s"), &Credentials).unwrap();
    for r in &mut old.routes {
        std::sync::Arc::make_mut(r).created_at -= 100;
    }
    let new = load_json_streaming_against(&doc("/b2", "t"), &Credentials, Some(&old)).unwrap();
    assert!(std::sync::Arc::ptr_eq(&new.routes[0], &old.routes[0]));
    assert!(!std::sync::Arc::ptr_eq(&new.routes[1], &old.routes[1]));
    assert_eq!(new.routes[1].paths.as_ref().unwrap()[0], "/b2");
    // c moved to service t: its own copy, naming t.
    assert!(!std::sync::Arc::ptr_eq(&new.routes[2], &old.routes[2]));
    assert_eq!(
        new.routes[2].service.as_ref().unwrap().id,
        new.services[1].id.as_str().into()
    );
    assert_eq!(
        old.routes[2].service.as_ref().unwrap().id,
        old.services[0].id.as_str().into()
    );
    // The same document: every route shared, and equal to a whole read.
    let same = load_json_streaming_against(&doc("/b", "s"), &Credentials, Some(&old)).unwrap();
    for (n, o) in same.routes.iter().zip(&old.routes) {
        assert!(std::sync::Arc::ptr_eq(n, o));
    }
    let mut again = same.clone();
    let c = again.changes_from(&old).unwrap();
    assert!(c.routes.is_empty() && !c.others, "{c:?}");
}

/// Consumers and their credentials are shared the same way: by id, and a key-auth key (whose
/// id is random when the file gives none) by its key, taking the running key's id.
#[test]
fn a_reload_shares_unchanged_consumers_and_keys() {
    let doc = |second_key: &str| {
        serde_json::json!({"_format_version": "3.0", "consumers": [
            {"username": "a", "keyauth_credentials": [{"key": "ka"}], "acls": [{"group": "g"}]},
            {"username": "b", "keyauth_credentials": [{"key": second_key}]}]})
        .to_string()
    };
    let old = load_json_streaming(&doc("kb"), &Credentials).unwrap();
    let same = load_json_streaming_against(&doc("kb"), &Credentials, Some(&old)).unwrap();
    for (n, o) in same.consumers.iter().zip(&old.consumers) {
        assert!(std::sync::Arc::ptr_eq(n, o));
    }
    for (n, o) in same.credentials.iter().zip(&old.credentials) {
        assert!(std::sync::Arc::ptr_eq(n, o), "{n:?}");
    }
    let changed = load_json_streaming_against(&doc("kb2"), &Credentials, Some(&old)).unwrap();
    let key = |c: &Config, k: &str| {
        c.credentials
            .iter()
            .position(|x| x.fields.get("key").and_then(|v| v.as_str()) == Some(k))
            .unwrap()
    };
    let (n, o) = (key(&changed, "ka"), key(&old, "ka"));
    assert!(std::sync::Arc::ptr_eq(
        &changed.credentials[n],
        &old.credentials[o]
    ));
    let n = key(&changed, "kb2");
    assert!(!old
        .credentials
        .iter()
        .any(|o| std::sync::Arc::ptr_eq(o, &changed.credentials[n])));
    assert_eq!(
        *changed.credentials[n].consumer.id,
        *changed.consumers[1].id
    );
    let mut c = changed.clone();
    assert!(c.changes_from(&old).unwrap().others);
    let mut s = same.clone();
    assert!(!s.changes_from(&old).unwrap().others);
}

/// Kong's unique fields across tables: each repeated value is the later entity's error, once,
/// and equal values of different fields or tables are not repeats.
#[test]
fn unique_fields_are_checked_per_table_and_field() {
    let doc = serde_json::json!({"_format_version": "3.0",
        "consumers": [
            {"username": "a", "custom_id": "x", "keyauth_credentials": [{"key": "k1"}]},
            {"username": "b", "custom_id": "a", "keyauth_credentials": [{"key": "k2"}]},
            {"username": "a", "custom_id": "x", "keyauth_credentials": [{"key": "k1"}]}],
        "services": [{"name": "a", "host": "h", "routes": [{"name": "a", "paths": ["/"]}]}]})
    .to_string();
    // The streaming reader leaves a document with errors to the document reader.
    assert!(load_json_streaming(&doc, &Credentials).is_none());
    {
        let text = load_str(&doc, &Credentials).unwrap_err().to_string();
        let count = |s: &str| text.matches(s).count();
        assert_eq!(count("uniqueness violation"), 4, "{text}");
        assert_eq!(count("with primary key set to"), 1, "{text}");
        assert_eq!(
            count("'consumers' entity with username set to 'a'"),
            1,
            "{text}"
        );
        assert_eq!(
            count("'consumers' entity with custom_id set to 'x'"),
            1,
            "{text}"
        );
        assert_eq!(
            count("'keyauth_credentials' entity with key set to 'k1'"),
            1,
            "{text}"
        );
    }
}

#[test]
fn extension_keys_hold_anchors_and_are_not_entities() {
    // decK files keep shared values under top-level `x-` keys and merge them with `<<`.
    let yaml = "_format_version: \"3.0\"\nx-defaults: &defaults\n  connect_timeout: 5000\n  retries: 2\nservices:\n  - name: a\n    url: http://127.0.0.1:9\n    <<: *defaults\n";
    let c = ok(yaml);
    assert_eq!(c.services.len(), 1);
    assert_eq!(c.services[0].connect_timeout, 5000);
    assert_eq!(c.services[0].retries, 2);
    // JSON, read entity by entity or whole: the same config, the same hash.
    let json = r#"{"_format_version": "3.0", "x-note": {"any": ["thing"]}, "services": [{"name": "a", "url": "http://127.0.0.1:9"}]}"#;
    let streamed = super::load_json_streaming(json, &Credentials).expect("streamed");
    let whole = super::load(&serde_json::from_str(json).unwrap(), &Credentials).unwrap();
    assert_eq!(streamed.services.len(), 1);
    assert_eq!(streamed.hash, whole.hash);
    // Any other unknown top-level key stays an error.
    assert!(err("_format_version: \"3.0\"\ny-defaults: {}\n")
        .to_string()
        .contains("y-defaults: unknown field"));
}
